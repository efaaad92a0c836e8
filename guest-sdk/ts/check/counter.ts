// Type-checked against marmot.d.ts by ./scripts/test (when node is present).
import { state, events, alarms, log, type ActorModule, type Json } from "marmot";

const actor: ActorModule = {
  async onMessage(body, ctx) {
    const by = typeof body === "object" && body !== null && !Array.isArray(body) ? Number(body.by ?? 1) : 1;
    const n = (state.get<number>("n") ?? 0) + by;
    state.set("n", n);
    events.emit("counted", { n });
    alarms.set("tick", { after: 1000, payload: { n } });
    log.info("counted", { n, id: ctx.id });
    const notes: [string, Json][] = state.list("note/");
    return { n, notes: notes.length };
  },
  onAlarm(alarm) {
    state.set("last", alarm.dueAt);
  },
};

export default actor;

// A JavaScript agent loop on model.chat, type-checked against marmot.d.ts.
import { model, state, type ActorModule, type ChatMessage, type Json } from "marmot";

const tools = [{ name: "add", description: "Add two numbers", input_schema: { type: "object" } }];

const actor: ActorModule = {
  async onMessage(body) {
    const messages = (state.get<Json[]>("transcript") ?? []) as ChatMessage[];
    messages.push({ role: "user", content: String(body) });
    for (let step = 0; step < 8; step++) {
      const r = await model.chat({ provider: "openai", model: "gpt-5-mini", messages, tools, stream: true });
      messages.push(r.message);
      if (r.stop_reason !== "tool_use") break;
      for (const call of r.message.tool_calls ?? []) {
        const a = call.arguments as { x: number; y: number };
        messages.push({ role: "tool", tool_call_id: call.id, content: { sum: a.x + a.y } });
      }
    }
    state.set("transcript", messages as Json[]);
    return messages[messages.length - 1].content ?? null;
  },
};

export default actor;

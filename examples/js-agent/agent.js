// A JavaScript agent that runs its own loop with model.chat: the other way
// to build an agent on Marmot (the built-in harness, `kind: "agent"`, is
// the first). One actor per conversation; the transcript lives in state.
//
//   marmot deploy js-agent examples/js-agent/agent.js
//   curl -s -X POST localhost:7878/v1/actors/js-agent/alice -d '{"ask": "What is 19 * 23?"}'
//
// Unlike the harness, the whole loop runs in one turn: nothing is
// committed until the answer is final, so a crash mid-loop re-runs it from
// the question (fine for tools without side effects, like these).
import { model, state, events } from "marmot";

const PROVIDER = "default";
const MODEL = "default";

// Tools implemented right here, in JavaScript.
const tools = {
  multiply: {
    description: "Multiply two numbers",
    input_schema: { type: "object", properties: { a: { type: "number" }, b: { type: "number" } }, required: ["a", "b"] },
    run: ({ a, b }) => ({ product: a * b }),
  },
  now: {
    description: "The current time (ISO 8601)",
    input_schema: { type: "object", properties: {} },
    run: () => ({ now: new Date().toISOString() }),
  },
};

const definitions = Object.entries(tools).map(([name, t]) => ({ name, description: t.description, input_schema: t.input_schema }));

export default {
  async onMessage(body) {
    const ask = typeof body === "string" ? body : body.ask;
    const messages = state.get("transcript") ?? [];
    messages.push({ role: "user", content: ask });
    let answer = null;
    for (let step = 0; step < 8; step++) {
      const r = await model.chat({
        provider: PROVIDER, model: MODEL, stream: true,
        system: "You are a terse assistant. Use the tools for arithmetic and time.",
        messages, tools: definitions,
      });
      messages.push(r.message);
      events.emit("model_step", { step, stop_reason: r.stop_reason, usage: r.usage });
      if (r.stop_reason !== "tool_use") {
        answer = r.message.content;
        break;
      }
      for (const call of r.message.tool_calls ?? []) {
        const tool = tools[call.name];
        const content = tool ? tool.run(call.arguments ?? {}) : `no tool named ${call.name}`;
        messages.push({ role: "tool", tool_call_id: call.id, content, is_error: !tool });
      }
    }
    state.set("transcript", messages.slice(-40));
    return { answer };
  },
};

// An eval script uses the global `marmot`.
export {};
const n = marmot.state.get<number>("n") ?? 0;
marmot.state.set("n", n + 1);
const bytes = new TextEncoder().encode(new URL("https://example.com/a?b=1").searchParams.get("b") ?? "");
crypto.getRandomValues(new Uint8Array(4));
setTimeout(() => console.log(bytes.length), 10);

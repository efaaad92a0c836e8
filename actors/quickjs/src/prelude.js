// Marmot's JavaScript prelude: runs once when the engine starts (and is
// captured in the pre-initialized snapshot), before any user code.
//
// The host hands over a few native functions on `globalThis.__marmot_host`;
// this file builds the public API from them, captures the built-ins it
// relies on (so user code that replaces `JSON` or patches prototypes cannot
// break the host's encoding), then removes the native handle.
(() => {
  "use strict";
  const host = globalThis.__marmot_host;
  delete globalThis.__marmot_host;

  const parse = JSON.parse;
  const stringify = JSON.stringify;
  const freeze = Object.freeze;
  const defineProperty = Object.defineProperty;
  const isArray = Array.isArray;
  const StringCtor = String;
  const ErrorCtor = Error;
  const TypeErrorCtor = TypeError;
  const apply = Reflect.apply;
  const isInteger = Number.isInteger;
  const toWellFormed = String.prototype.toWellFormed;
  const indexOf = String.prototype.indexOf;
  const entriesOf = Object.entries;
  // Arrays built without their prototype's methods, which user code may
  // have replaced: `Array.prototype.push` replaced broke `state.list` for
  // the actor that did it. (An index setter defined on `Array.prototype`
  // still breaks the engine's own `JSON.stringify`, so every write of that
  // actor's: it harms only itself.)
  const append = (arr, v) =>
    defineProperty(arr, arr.length, { value: v, writable: true, enumerable: true, configurable: true });
  const mapped = (arr, f) => {
    const out = [];
    for (let i = 0; i < arr.length; i++) append(out, f(arr[i]));
    return out;
  };
  // Text for the host, which takes UTF-8: a lone surrogate becomes U+FFFD,
  // as WHATWG's TextEncoder has it (it used to throw a TypeError).
  const text = (v) => apply(toWellFormed, StringCtor(v), []);

  const toJson = (value, what) => {
    if (value === undefined) {
      throw new TypeErrorCtor(`${what}: undefined cannot be stored; use null or delete the key`);
    }
    let text;
    try {
      text = stringify(value);
    } catch (e) {
      throw new TypeErrorCtor(`${what}: value is not JSON-serializable (${e && e.message})`);
    }
    if (text === undefined) {
      throw new TypeErrorCtor(`${what}: value is not JSON-serializable`);
    }
    // A lone surrogate is written as a `\udXXX` escape, which strict JSON
    // parsers refuse: U+FFFD instead (host `wellFormedJson`).
    return apply(indexOf, text, ["\\ud"]) === -1 ? text : host.wellFormedJson(text);
  };
  const fromStored = (text) => {
    if (text === undefined || text === null) return undefined;
    try {
      return parse(text);
    } catch (_) {
      return text;
    }
  };
  // A key as the host takes it: a lone surrogate becomes U+FFFD, as in
  // every text leaving the sandbox, so the same name finds the same key
  // (it threw "Conversion from string failed" naming no call).
  const key = (k, what) => {
    if (typeof k !== "string") throw new TypeErrorCtor(`${what}: key must be a string`);
    return text(k);
  };
  // A file's path, as the host takes it (a missing variable used to write
  // a file called `undefined`).
  const path = (p, what) => {
    if (typeof p !== "string") throw new TypeErrorCtor(`${what}: path must be a string`);
    return text(p);
  };
  // Binary data as one Uint8Array over its bytes, or undefined for data
  // of another kind (text or JSON).
  const Uint8ArrayCtor = Uint8Array;
  const ArrayBufferCtor = ArrayBuffer;
  const isView = ArrayBuffer.isView;
  const bytes = (data) => {
    if (data instanceof ArrayBufferCtor) return new Uint8ArrayCtor(data);
    if (isView(data)) return new Uint8ArrayCtor(data.buffer, data.byteOffset, data.byteLength);
    return undefined;
  };

  const state = freeze({
    get(k) {
      return fromStored(host.stateGet(key(k, "state.get")));
    },
    set(k, value) {
      host.stateSet(key(k, "state.set"), toJson(value, "state.set"));
    },
    delete(k) {
      return host.stateDelete(key(k, "state.delete"));
    },
    // All entries under `prefix`, or with `{after, limit}` one page of
    // them: a state larger than the sandbox's memory cannot be read whole.
    list(prefix = "", page = undefined) {
      let after = undefined;
      let limit = Infinity;
      if (page !== undefined) {
        if (page === null || typeof page !== "object") throw new TypeErrorCtor("state.list: the page must be an object {after, limit}");
        if (page.after !== undefined) after = key(page.after, "state.list after");
        if (page.limit !== undefined) {
          limit = page.limit;
          if (!isInteger(limit) || limit < 1) throw new TypeErrorCtor("state.list: limit must be a whole number, 1 or more");
        }
      }
      const out = [];
      for (;;) {
        const want = limit - out.length < 256 ? limit - out.length : 256;
        const got = host.stateList(key(prefix, "state.list"), after, want);
        for (let i = 0; i < got.length; i++) append(out, [got[i][0], fromStored(got[i][1])]);
        if (got.length < want || out.length >= limit) return out;
        after = got[got.length - 1][0];
      }
    },
  });

  const events = freeze({
    emit(kind, data = null) {
      return host.emit(text(kind), toJson(data, "events.emit"));
    },
  });

  const fields = (f) => {
    if (f === undefined || f === null) return [];
    if (typeof f !== "object") throw new TypeErrorCtor("log: fields must be an object");
    return mapped(entriesOf(f), (e) => [text(e[0]), typeof e[1] === "string" ? text(e[1]) : toJson(e[1], "log fields")]);
  };
  const log = freeze({
    debug: (msg, f) => host.log("debug", text(msg), fields(f)),
    info: (msg, f) => host.log("info", text(msg), fields(f)),
    warn: (msg, f) => host.log("warn", text(msg), fields(f)),
    error: (msg, f) => host.log("error", text(msg), fields(f)),
  });

  // What a value is, for an error naming what was given instead.
  const kindOf = (v) =>
    v === null || v === undefined ? StringCtor(v) : typeof v === "object" ? "an object" : `a ${typeof v}`;

  // Milliseconds for `at` or `after`: a finite number ≥ 0 (a Date for
  // `at`). `+spec.at` used to make a date string NaN and NaN 0, so an alarm
  // meant for next year fired at once.
  const DateCtor = Date;
  const getTime = Date.prototype.getTime;
  const isFinite = Number.isFinite;
  // The latest instant a Date can hold (year 275760).
  const MAX_MS = 8.64e15;
  const millis = (v, what) => {
    if (what === "at" && v instanceof DateCtor) v = apply(getTime, v, []);
    // (`after` too: now plus it must still be a Date.)
    const max = what === "at" ? MAX_MS : MAX_MS - DateCtor.now();
    if (typeof v !== "number" || !isFinite(v) || v < 0 || v > max) {
      const got = typeof v === "number" ? StringCtor(v) : kindOf(v);
      const want = what === "at" ? `epoch milliseconds (0 to ${MAX_MS}) or a Date` : `milliseconds (0 to ${max})`;
      throw new TypeErrorCtor(`alarms.set: \`${what}\` must be ${want}, not ${got}`);
    }
    return v;
  };
  const alarmName = (name, what) => {
    if (typeof name !== "string") throw new TypeErrorCtor(`${what}: name must be a string`);
    return text(name);
  };

  const alarms = freeze({
    // spec: { at: epochMs } | { after: ms } | { cron: "…", tz: "Europe/Berlin" }, plus payload.
    set(name, spec = {}) {
      const n = alarmName(name, "alarms.set");
      if (spec === null || typeof spec !== "object") throw new TypeErrorCtor("alarms.set: spec must be an object");
      const given = (spec.at !== undefined) + (spec.after !== undefined) + (spec.cron !== undefined);
      if (given !== 1) throw new TypeErrorCtor("alarms.set: give exactly one of at, after or cron");
      // (`tz: null` is how `alarms.list` shows a cron without one.)
      if (spec.tz != null && spec.cron === undefined) {
        throw new TypeErrorCtor("alarms.set: tz goes with cron (at is an instant, after a delay)");
      }
      const payload = toJson(spec.payload === undefined ? null : spec.payload, "alarms.set payload");
      if (spec.cron !== undefined) {
        // (`String(null)` was a cron expression "null", refused as invalid.)
        if (typeof spec.cron !== "string") {
          throw new TypeErrorCtor(`alarms.set: \`cron\` must be a string such as "0 9 * * *", not ${kindOf(spec.cron)}`);
        }
        if (spec.tz != null && typeof spec.tz !== "string") {
          throw new TypeErrorCtor(`alarms.set: \`tz\` must be a time zone name such as "Europe/Berlin", not ${kindOf(spec.tz)}`);
        }
        return host.alarmsSet(n, "cron", 0, text(spec.cron), spec.tz == null ? undefined : text(spec.tz), payload);
      }
      if (spec.at !== undefined) return host.alarmsSet(n, "at", millis(spec.at, "at"), undefined, undefined, payload);
      return host.alarmsSet(n, "after", millis(spec.after, "after"), undefined, undefined, payload);
    },
    cancel(name) {
      return host.alarmsCancel(alarmName(name, "alarms.cancel"));
    },
    list() {
      return mapped(parse(host.alarmsList()), (a) => ({ ...a, payload: fromStored(a.payload) }));
    },
  });

  const inputs = freeze({
    request(req = {}) {
      if (req === null || typeof req !== "object") throw new TypeErrorCtor("inputs.request: expected an object");
      const schema = req.schema === undefined ? undefined : toJson(req.schema, "inputs.request schema");
      const expires = req.expiresInMs === undefined ? undefined : +req.expiresInMs;
      return host.inputsRequest(text(req.kind ?? ""), text(req.prompt ?? ""), schema, expires);
    },
    cancel: (id) => host.inputsCancel(text(id)),
  });

  // A message is JSON, so a string is one too: sent raw, `"hello"` was
  // refused by the callee as bad JSON (a `send` lost it) and `"42"` arrived
  // as a number.
  const body = (b) => toJson(b === undefined ? null : b, "message");
  const actors = freeze({
    async call(type, id, message) {
      const reply = host.actorsCall(text(type), text(id), body(message));
      return reply.json ? fromStored(reply.body) : reply.body;
    },
    // With the status and content type (a callee's own 4xx is a reply).
    async callResponse(type, id, message) {
      const reply = host.actorsCall(text(type), text(id), body(message));
      return {
        status: reply.status,
        contentType: reply.contentType ?? null,
        body: reply.json ? fromStored(reply.body) : reply.body,
      };
    },
    send(type, id, message) {
      host.actorsSend(text(type), text(id), body(message));
    },
  });

  // Text is stored as UTF-8, bytes (a typed array, DataView or
  // ArrayBuffer) as they are, anything else as its JSON.
  const files = freeze({
    read: (p) => host.filesRead(path(p, "files.read")),
    readBytes: (p) => host.filesReadBytes(path(p, "files.readBytes")),
    write(p, data) {
      const at = path(p, "files.write");
      const b = bytes(data);
      if (b !== undefined) return host.filesWriteBytes(at, b);
      return host.filesWrite(at, typeof data === "string" ? text(data) : toJson(data, "files.write"));
    },
    list: (prefix = "") => parse(host.filesList(path(prefix, "files.list"))),
    delete: (p) => host.filesDelete(path(p, "files.delete")),
  });

  // model.chat: the normalized chat shape (docs/models.md), any provider.
  const model = freeze({
    async chat(req) {
      if (req === null || typeof req !== "object") throw new TypeErrorCtor("model.chat: expected an object");
      return parse(host.modelChat(toJson(req, "model.chat")));
    },
  });

  const marmot = freeze({ state, events, alarms, inputs, actors, files, model, log });
  defineProperty(globalThis, "marmot", { value: marmot, enumerable: false });
  defineProperty(globalThis, "__marmot_module", { value: marmot, enumerable: false });

  // console: captured by the host (the turn's logs, or eval's `logs`).
  const show = (v) => {
    if (typeof v === "string") return v;
    if (v instanceof ErrorCtor) return v.stack ? `${v.name}: ${v.message}\n${v.stack}` : `${v.name}: ${v.message}`;
    if (typeof v === "function") return `[Function ${v.name || "anonymous"}]`;
    if (typeof v === "bigint") return `${v}n`;
    if (typeof v === "symbol") return StringCtor(v);
    try {
      const t = stringify(v);
      if (t === undefined) return StringCtor(v);
      return apply(indexOf, t, ["\\ud"]) === -1 ? t : host.wellFormedJson(t);
    } catch (_) {
      return StringCtor(v);
    }
  };
  const line = (args) => {
    let out = "";
    for (let i = 0; i < args.length; i++) out += (i === 0 ? "" : " ") + show(args[i]);
    return text(out);
  };
  const consoleObj = {
    log: (...a) => host.console("info", line(a)),
    info: (...a) => host.console("info", line(a)),
    debug: (...a) => host.console("debug", line(a)),
    warn: (...a) => host.console("warn", line(a)),
    error: (...a) => host.console("error", line(a)),
  };
  defineProperty(globalThis, "console", { value: freeze(consoleObj), writable: true, configurable: true });

  // setTimeout within a turn: timers run while the turn waits for its
  // promise; whatever is still pending when the turn ends is dropped.
  let nextTimer = 1;
  const timers = new Map();
  globalThis.setTimeout = (fn, ms = 0, ...args) => {
    if (typeof fn !== "function") throw new TypeErrorCtor("setTimeout: callback must be a function");
    const id = nextTimer++;
    // At most 2^31 - 1 ms, as browsers and Node hold a delay (Infinity used
    // to panic the engine): the turn's own time limit comes first anyway.
    timers.set(id, { due: host.now() + Math.min(Math.max(0, +ms || 0), 2147483647), fn, args });
    return id;
  };
  globalThis.clearTimeout = (id) => {
    timers.delete(id);
  };
  defineProperty(globalThis, "__marmot_timers", {
    value: freeze({
      // Milliseconds until the earliest timer is due, or -1 if none.
      next() {
        let best = -1;
        // No timer, no clock: a module whose top level waits on nothing
        // must not read as one that used timers.
        if (timers.size === 0) return best;
        const now = host.now();
        for (const t of timers.values()) {
          const d = Math.max(0, t.due - now);
          if (best < 0 || d < best) best = d;
        }
        return best;
      },
      // Run every timer that is due.
      fire() {
        const now = host.now();
        for (const [id, t] of [...timers.entries()]) {
          if (t.due <= now) {
            timers.delete(id);
            t.fn(...t.args);
          }
        }
      },
      // Drop what the turn left pending: its timers, and its fetches
      // (which the host cancels).
      clear() {
        timers.clear();
        fetching.clear();
      },
    }),
    enumerable: false,
  });

  // The handlers' second argument, built by a literal: one shape for every
  // turn instead of four property insertions from the host.
  defineProperty(globalThis, "__marmot_turn", {
    value: (type, id, version, messageId) => ({ type, id, version, messageId }),
    enumerable: false,
  });

  // crypto.getRandomValues from WASI random.
  const getRandomValues = (array) => {
    if (!ArrayBuffer.isView(array) || array instanceof Float32Array || array instanceof Float64Array) {
      throw new TypeErrorCtor("crypto.getRandomValues: expected an integer TypedArray");
    }
    if (array.byteLength > 65536) {
      throw new ErrorCtor("crypto.getRandomValues: at most 65536 bytes per call");
    }
    new Uint8Array(array.buffer, array.byteOffset, array.byteLength).set(host.randomBytes(array.byteLength));
    return array;
  };
  defineProperty(globalThis, "crypto", { value: freeze({ getRandomValues }), writable: true, configurable: true });

  // TextEncoder / TextDecoder (UTF-8).
  class TextEncoder {
    get encoding() {
      return "utf-8";
    }
    encode(s = "") {
      return host.utf8Encode(text(s));
    }
    // As much of `s` as fits in `dest`, never half a character: how many
    // UTF-16 units were read and bytes written.
    encodeInto(s, dest) {
      if (!(dest instanceof Uint8ArrayCtor)) throw new TypeErrorCtor("TextEncoder.encodeInto: the destination must be a Uint8Array");
      const str = text(s);
      let read = 0;
      let written = 0;
      for (const ch of str) {
        const cp = ch.codePointAt(0);
        const n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        if (written + n > dest.length) break;
        written += n;
        read += ch.length;
      }
      dest.set(host.utf8Encode(str.slice(0, read)));
      return { read, written };
    }
  }
  class TextDecoder {
    constructor(label = "utf-8", options = {}) {
      const l = StringCtor(label).toLowerCase();
      if (l !== "utf-8" && l !== "utf8") throw new RangeError(`TextDecoder: unsupported encoding ${label}`);
      this.fatal = !!(options && options.fatal);
      this.ignoreBOM = !!(options && options.ignoreBOM);
    }
    get encoding() {
      return "utf-8";
    }
    decode(bytes = new Uint8Array(0)) {
      let view;
      if (bytes instanceof ArrayBuffer) view = new Uint8Array(bytes);
      else if (ArrayBuffer.isView(bytes)) view = new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      else throw new TypeErrorCtor("TextDecoder.decode: expected a BufferSource");
      const out = host.utf8Decode(view, this.fatal);
      // WHATWG: a leading byte order mark is not text, unless asked.
      return !this.ignoreBOM && out.charCodeAt(0) === 0xfeff ? out.slice(1) : out;
    }
  }
  globalThis.TextEncoder = TextEncoder;
  globalThis.TextDecoder = TextDecoder;

  // URL and URLSearchParams (WHATWG), parsed by the host's `url` crate.
  class URLSearchParams {
    #list = [];
    #onChange = null;
    constructor(init = "") {
      if (typeof init === "string") {
        this.#list = host.formDecode(init.startsWith("?") ? init.slice(1) : init);
      } else if (init instanceof URLSearchParams) {
        this.#list = [...init.entries()];
      } else if (init && typeof init[Symbol.iterator] === "function") {
        for (const pair of init) {
          const p = [...pair];
          if (p.length !== 2) throw new TypeErrorCtor("URLSearchParams: each pair needs a name and a value");
          this.#list.push([text(p[0]), text(p[1])]);
        }
      } else if (init && typeof init === "object") {
        for (const k of Object.keys(init)) this.#list.push([k, text(init[k])]);
      }
    }
    static _bind(params, onChange) {
      params.#onChange = onChange;
      return params;
    }
    static _reset(params, search) {
      params.#list = host.formDecode(search.startsWith("?") ? search.slice(1) : search);
    }
    #changed() {
      if (this.#onChange) this.#onChange(this.toString());
    }
    get size() {
      return this.#list.length;
    }
    append(k, v) {
      this.#list.push([text(k), text(v)]);
      this.#changed();
    }
    delete(k, v) {
      k = text(k);
      this.#list = this.#list.filter(([a, b]) => a !== k || (v !== undefined && b !== text(v)));
      this.#changed();
    }
    get(k) {
      k = text(k);
      const e = this.#list.find(([a]) => a === k);
      return e ? e[1] : null;
    }
    getAll(k) {
      k = text(k);
      return this.#list.filter(([a]) => a === k).map(([, b]) => b);
    }
    has(k, v) {
      k = text(k);
      return this.#list.some(([a, b]) => a === k && (v === undefined || b === text(v)));
    }
    set(k, v) {
      k = text(k);
      v = text(v);
      const i = this.#list.findIndex(([a]) => a === k);
      if (i < 0) this.#list.push([k, v]);
      else {
        this.#list[i] = [k, v];
        this.#list = this.#list.filter(([a], j) => a !== k || j === i);
      }
      this.#changed();
    }
    sort() {
      this.#list.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
      this.#changed();
    }
    forEach(fn, thisArg) {
      for (const [k, v] of this.#list) fn.call(thisArg, v, k, this);
    }
    *entries() {
      for (const [k, v] of this.#list) yield [k, v];
    }
    *keys() {
      for (const [k] of this.#list) yield k;
    }
    *values() {
      for (const [, v] of this.#list) yield v;
    }
    [Symbol.iterator]() {
      return this.entries();
    }
    toString() {
      return host.formEncode(this.#list);
    }
  }
  const bindParams = URLSearchParams._bind;
  const resetParams = URLSearchParams._reset;
  delete URLSearchParams._bind;
  delete URLSearchParams._reset;

  class URL {
    #p;
    #params = null;
    constructor(input, base) {
      const parsed = host.urlParse(text(input), base === undefined ? undefined : text(base));
      if (parsed === undefined || parsed === null) throw new TypeErrorCtor(`Invalid URL: ${input}`);
      this.#p = parse(parsed);
    }
    static canParse(input, base) {
      const parsed = host.urlParse(text(input), base === undefined ? undefined : text(base));
      return parsed !== undefined && parsed !== null;
    }
    #set(field, value) {
      this.#p = parse(host.urlSet(this.#p.href, field, text(value)));
      if (this.#params && field !== "search") resetParams(this.#params, this.#p.search);
    }
    get href() { return this.#p.href; }
    set href(v) { this.#set("href", v); if (this.#params) resetParams(this.#params, this.#p.search); }
    get origin() { return this.#p.origin; }
    get protocol() { return this.#p.protocol; }
    set protocol(v) { this.#set("protocol", v); }
    get username() { return this.#p.username; }
    set username(v) { this.#set("username", v); }
    get password() { return this.#p.password; }
    set password(v) { this.#set("password", v); }
    get host() { return this.#p.host; }
    set host(v) { this.#set("host", v); }
    get hostname() { return this.#p.hostname; }
    set hostname(v) { this.#set("hostname", v); }
    get port() { return this.#p.port; }
    set port(v) { this.#set("port", v); }
    get pathname() { return this.#p.pathname; }
    set pathname(v) { this.#set("pathname", v); }
    get search() { return this.#p.search; }
    set search(v) {
      this.#set("search", v);
      if (this.#params) resetParams(this.#params, this.#p.search);
    }
    get hash() { return this.#p.hash; }
    set hash(v) { this.#set("hash", v); }
    get searchParams() {
      if (!this.#params) {
        this.#params = bindParams(new URLSearchParams(this.#p.search), (q) => {
          this.#p = parse(host.urlSet(this.#p.href, "search", q));
        });
      }
      return this.#params;
    }
    toString() { return this.#p.href; }
    toJSON() { return this.#p.href; }
  }
  globalThis.URL = URL;
  globalThis.URLSearchParams = URLSearchParams;

  // Headers (WHATWG, the parts scripts use): names are case-insensitive,
  // `get` of an absent one is null, repeated ones join with ", ".
  class Headers {
    #list = [];
    constructor(init) {
      if (init === undefined || init === null) return;
      // Any iterable of pairs (an array, a Map, a Headers, a generator),
      // else a record of names to values.
      const pairs = typeof init !== "object" && typeof init !== "function" ? undefined
        : typeof init[Symbol.iterator] === "function" ? init
        : Object.entries(init);
      if (pairs === undefined) throw new TypeErrorCtor("Headers: expected an object, an iterable of pairs or a Headers");
      for (const entry of pairs) {
        const pair = isArray(entry) ? entry : [...entry];
        if (pair.length !== 2) throw new TypeErrorCtor("Headers: each entry must be a [name, value] pair");
        this.append(pair[0], pair[1]);
      }
    }
    append(name, value) {
      this.#list.push([text(name).toLowerCase(), text(value)]);
    }
    set(name, value) {
      this.delete(name);
      this.append(name, value);
    }
    delete(name) {
      const n = text(name).toLowerCase();
      this.#list = this.#list.filter(([k]) => k !== n);
    }
    get(name) {
      const n = text(name).toLowerCase();
      const values = this.#list.filter(([k]) => k === n).map(([, v]) => v);
      return values.length === 0 ? null : values.join(", ");
    }
    has(name) {
      return this.get(name) !== null;
    }
    *entries() {
      const names = [...new Set(this.#list.map(([k]) => k))].sort();
      for (const n of names) yield [n, this.get(n)];
    }
    *keys() {
      for (const [k] of this.entries()) yield k;
    }
    *values() {
      for (const [, v] of this.entries()) yield v;
    }
    forEach(f, thisArg) {
      for (const [k, v] of this.entries()) apply(f, thisArg, [v, k, this]);
    }
    [Symbol.iterator]() {
      return this.entries();
    }
    // Each header as sent (repeats kept), for the host.
    toPairs() {
      return this.#list.map(([k, v]) => [k, v]);
    }
  }
  globalThis.Headers = Headers;

  // fetch, backed by the host's `http` capability: only allow-listed hosts
  // are reachable, and header values may name host secrets
  // ("{{secret:NAME}}") that never enter the sandbox. Bodies are bytes both
  // ways: text goes as UTF-8, a typed array or ArrayBuffer as it is.
  const utf8 = (bytes) => host.utf8Decode(bytes, false);
  // The standard constructor (`new Response("hi", { status: 201 })`, as
  // mocks use it); `fetch` makes its own with the bytes it got.
  class Response {
    #body;
    #used = false;
    // A null body (`new Response(null)`, a HEAD or a 204) is never used:
    // it reads as empty every time, as the standard has it.
    #none = false;
    constructor(body = null, options = undefined) {
      const init = options ?? {};
      const status = init.status === undefined ? 200 : +init.status;
      if (!(status >= 200 && status <= 599) || status !== Math.trunc(status)) {
        throw new RangeError(`Response: status must be a whole number from 200 to 599, not ${init.status}`);
      }
      this.status = status;
      this.ok = status >= 200 && status < 300;
      this.statusText = init.statusText === undefined ? "" : StringCtor(init.statusText);
      this.headers = new Headers(init.headers);
      this.url = "";
      this.redirected = false;
      this.type = "default";
      this.#none = body === null || body === undefined;
      this.#body = requestBody(body) ?? new Uint8ArrayCtor(0);
    }
    // A body is read once, as the standard has it (a second read gave the
    // body again, and code that relied on it broke elsewhere); `clone()`
    // first to read it twice.
    get bodyUsed() {
      return this.#used;
    }
    #take() {
      if (this.#none) return this.#body;
      if (this.#used) throw new TypeErrorCtor("Response: body has already been read (clone() it to read it twice)");
      this.#used = true;
      return this.#body;
    }
    clone() {
      if (this.#used) throw new TypeErrorCtor("Response.clone: body has already been read");
      const copy = new Response(this.#none ? null : new Uint8ArrayCtor(this.#body), {
        statusText: this.statusText,
        headers: this.headers,
      });
      for (const k of ["status", "ok", "url", "redirected", "type"]) {
        defineProperty(copy, k, { value: this[k], enumerable: true, writable: true });
      }
      return copy;
    }
    async text() {
      return utf8(this.#take());
    }
    async json() {
      return parse(utf8(this.#take()));
    }
    async bytes() {
      return new Uint8ArrayCtor(this.#take());
    }
    async arrayBuffer() {
      return new Uint8ArrayCtor(this.#take()).buffer;
    }
  }
  globalThis.Response = Response;
  const requestBody = (b) => {
    if (b === undefined || b === null) return undefined;
    const raw = bytes(b);
    if (raw !== undefined) return new Uint8ArrayCtor(raw);
    return host.utf8Encode(text(b));
  };
  // Fetches under way, by the host's handle: how to settle each one's
  // promise. The engine waits for them (`wait`) whenever the turn has
  // nothing else to run; the host cancels those left when the turn ends,
  // and `__marmot_timers.clear` forgets them.
  const PromiseCtor = Promise;
  const fetching = new Map();
  defineProperty(globalThis, "__marmot_fetches", {
    value: freeze({
      // Wait up to `timeoutMs` (< 0: as long as it takes) for one fetch
      // to answer, and settle its promise; false if none is under way.
      wait(timeoutMs) {
        if (fetching.size === 0) return false;
        const handle = host.httpWaitAny([...fetching.keys()], timeoutMs < 0 ? undefined : timeoutMs);
        if (handle === undefined) return true;
        const settle = fetching.get(handle);
        fetching.delete(handle);
        let answer;
        try {
          answer = host.httpFinish(handle);
        } catch (e) {
          settle.reject(e);
          return true;
        }
        settle.resolve(answer);
        return true;
      },
    }),
    enumerable: false,
  });
  globalThis.fetch = async (input, options = undefined) => {
    const init = options ?? {};
    const url = input instanceof URL ? input.href : text(input);
    const method = text(init.method ?? "GET").toUpperCase();
    const given = new Headers(init.headers);
    // The content type a body implies, as the standard fetch sets it (a
    // string went without one, and servers read it as bytes or refused it).
    if (init.body !== undefined && init.body !== null && !given.has("content-type")) {
      if (init.body instanceof URLSearchParams) {
        given.set("content-type", "application/x-www-form-urlencoded;charset=UTF-8");
      } else if (typeof init.body === "string") {
        given.set("content-type", "text/plain;charset=UTF-8");
      }
    }
    // Whole milliseconds, at least 1 (`0`, `-5` and `1.5` became 1 ms
    // without a word, and a string failed in the binding's words).
    const timeoutMs = init.timeoutMs ?? undefined;
    if (timeoutMs !== undefined && !(typeof timeoutMs === "number" && timeoutMs >= 1 && timeoutMs % 1 === 0)) {
      const got = typeof timeoutMs === "number" ? text(timeoutMs)
        : typeof timeoutMs === "object" ? "an object" : `a ${typeof timeoutMs}`;
      throw new TypeError(`fetch: timeoutMs must be a whole number of milliseconds, at least 1 (got ${got})`);
    }
    const headers = given.toPairs();
    // Started at once, answered while the script goes on: fetches the
    // script does not await one by one (`Promise.all`) run side by side.
    const handle = host.httpStart(method, url, headers, requestBody(init.body), timeoutMs);
    const [status, h, body] = await new PromiseCtor((resolve, reject) => fetching.set(handle, { resolve, reject }));
    // (Any status a server sends, 1xx–5xx, not only those a script may make.)
    const empty = method === "HEAD" || status === 204 || status === 205 || status === 304;
    const resp = new Response(empty ? null : body, { headers: h });
    defineProperty(resp, "status", { value: status, enumerable: true });
    defineProperty(resp, "ok", { value: status >= 200 && status < 300, enumerable: true });
    resp.url = url;
    resp.type = "basic";
    return resp;
  };

  // Math.random from WASI random: the engine is snapshotted after start-up,
  // so QuickJS's own seed would be the same in every sandbox.
  const randomFloat = host.randomFloat;
  defineProperty(Math, "random", { value: () => randomFloat(), writable: true, configurable: true });

  // No way out of the sandbox through the engine itself.
  delete globalThis.WebAssembly;
  delete globalThis.SharedArrayBuffer;
  delete globalThis.Atomics;
})();

// TypeScript declarations for Marmot's JavaScript actors and eval scripts.
//
// A JavaScript actor is an ES module run by Marmot's built-in QuickJS
// engine. It imports its capabilities from "marmot" and default-exports its
// handlers. Scripts sent to `POST /v1/actors/{type}/{id}/eval` see the same
// API as the global `marmot`. Everything a turn writes commits when its
// handler returns (or its promise resolves); a thrown error commits nothing.
//
// Use: add this file to your editor's or model's context, or reference it
// with `/// <reference path="marmot.d.ts" />`.

declare module "marmot" {
  /** Any value that survives `JSON.stringify` / `JSON.parse`. */
  export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

  /** What an API call the host refuses throws: an `Error` whose message
   * names the call (`"fetch: denied: …"`) and whose `code` says why. */
  export interface HostError extends Error {
    code: "invalid" | "limit_exceeded" | "denied" | "not_found" | "internal" | "unsupported";
  }

  /** Passed to every handler. */
  export interface TurnContext {
    /** The actor type. */
    type: string;
    /** The actor id. */
    id: string;
    /** Version of the type's code running this turn. */
    version: number;
    /** Id of the message (or delivery) that started the turn. */
    messageId: string;
  }

  /** A durable wake-up that became due. */
  export interface AlarmEvent {
    name: string;
    payload: Json;
    /** When this delivery was due, in milliseconds since the Unix epoch.
     * A delivery retried after the handler failed is due later than the
     * alarm was set for (by the retry's backoff): a handler that needs
     * the occurrence it stands for (a daily digest's date) should carry
     * it in the payload, or round `dueAt` to the schedule. */
    dueAt: number;
  }

  /** A verified inbound webhook. */
  export interface WebhookEvent {
    /** The `{name}` of `/v1/hooks/{type}/{id}/{name}`. */
    name: string;
    /** Lowercase header names. */
    headers: Record<string, string>;
    /** Parsed JSON when the body is JSON, else the text. */
    body: Json;
  }

  /** The answer to an input request. */
  export interface InputEvent {
    id: string;
    kind: string;
    /** `undefined` when the request expired unanswered. */
    response: Json | undefined;
    expired: boolean;
  }

  /** The reply to a message: objects, arrays, numbers, booleans and null are
   * sent as JSON; strings as text; `undefined` as JSON `null`. */
  export type Reply = Json | undefined;

  /** What a JavaScript actor module default-exports. Only `onMessage` is
   * required for messages; the others are needed for the deliveries that use
   * them. Handlers may be async. */
  export interface ActorModule {
    /** A message. `body` is the parsed JSON value when the request is JSON
     * (or parses as JSON without saying otherwise), else a string;
     * `undefined` when empty. */
    onMessage?(body: Json | undefined, ctx: TurnContext): Reply | Promise<Reply>;
    onAlarm?(alarm: AlarmEvent, ctx: TurnContext): void | Promise<void>;
    onWebhook?(req: WebhookEvent, ctx: TurnContext): void | Promise<void>;
    onInput?(input: InputEvent, ctx: TurnContext): void | Promise<void>;
    /** Runs once per actor when it first runs a newer version of the type. */
    onUpgrade?(fromVersion: number, ctx: TurnContext): void | Promise<void>;
  }

  /** The actor's key-value state. Values are JSON; keys are strings of at
   * most 1 KiB. Reads see this turn's own writes. */
  export interface State {
    /** The value under `key`, or `undefined`. */
    get<T extends Json = Json>(key: string): T | undefined;
    /** Store a JSON value (not `undefined`: use `delete`). */
    set(key: string, value: Json): void;
    /** Remove `key`; whether it existed. */
    delete(key: string): boolean;
    /** Every entry whose key starts with `prefix`, in key order; with
     * `page`, at most `limit` of them whose keys come after `after` (a
     * state larger than the sandbox's memory is read a page at a time). */
    list<T extends Json = Json>(
      prefix?: string,
      page?: { after?: string; limit?: number },
    ): [string, T][];
  }

  /** The actor's append-only event log. */
  export interface Events {
    /** Append an event; returns its sequence number (the first is 1). */
    emit(kind: string, data?: Json): number;
  }

  /** When an alarm fires: at a time, after a delay, or on a cron schedule. */
  export type AlarmSpec =
    | { at: number | Date; payload?: Json }
    | { after: number; payload?: Json }
    | { cron: string; tz?: string | null; payload?: Json };

  export interface AlarmInfo {
    name: string;
    schedule: { at: number } | { after: number } | { cron: string; tz: string | null };
    nextDue: number;
    payload: Json;
  }

  /** Durable wake-ups. Setting a name again replaces it. */
  export interface Alarms {
    set(name: string, spec: AlarmSpec): void;
    cancel(name: string): boolean;
    list(): AlarmInfo[];
  }

  export interface InputRequest {
    kind: string;
    prompt: string;
    /** A JSON Schema the answer should satisfy. */
    schema?: Json;
    expiresInMs?: number;
  }

  /** Durable waits for a person or a system; answers arrive as `onInput`. */
  export interface Inputs {
    /** Returns the input id. Throws (code `invalid`) when the module's
     * default export has no `onInput`: nothing could take the answer. */
    request(req: InputRequest): string;
    /** Withdraw a pending request of this actor: `cancelled` once the turn commits. */
    cancel(id: string): void;
  }

  /** Messages to other actors. */
  export interface Actors {
    /** Send and wait for the reply: the callee gets `body` as this value
     * (a string stays a string); a JSON reply comes back parsed, any other
     * (a text reply) as its text. Throws with `code` `"limit_exceeded"`
     * when the callee cannot take it now (its mailbox full, its type's
     * rate limit: retry later), `"not_found"` when its type is not
     * deployed, `"internal"` when its turn failed, could not run where it
     * was (it was moving, its code missing there) or did not reply in
     * time: retrying may succeed. */
    call(type: string, id: string, body?: Json): Promise<Json>;
    /** `call`, with the reply's HTTP status and content type: a callee's
     * own 4xx (`{"error": …}` from an agent, a Rust actor's 404) is a
     * reply like any other to `call`. */
    callResponse(type: string, id: string, body?: Json): Promise<{
      status: number; contentType: string | null; body: Json }>;
    /** Send one way, durably, after this turn commits. */
    send(type: string, id: string, body?: Json): void;
  }

  export interface FileInfo {
    path: string;
    size: number;
    modifiedAt: number;
  }

  /** Files under the actor's workspace; `outputs/` holds downloadable artifacts. */
  export interface Files {
    /** The file as text (UTF-8; invalid bytes become U+FFFD). */
    read(path: string): string;
    /** The file's bytes. */
    readBytes(path: string): Uint8Array;
    /** Text as UTF-8, bytes as they are, any other value as its JSON. */
    write(path: string, data: string | Uint8Array | ArrayBuffer | ArrayBufferView | Json): void;
    list(prefix?: string): FileInfo[];
    delete(path: string): boolean;
  }

  /** A tool call the model made. */
  export type ToolCall = {
    id: string;
    name: string;
    /** JSON, or the raw text when the model wrote something else. */
    arguments: Json;
  };

  /** One message of a conversation. Keys not listed here (`cache_control`…)
   * pass through to the provider. A transcript kept in `state` is stored
   * as `Json` (`state.set("transcript", messages as Json[])`). */
  export type ChatMessage =
    | { role: "system"; content: string | Json[] }
    | { role: "user"; content: string | Json[] }
    | {
        role: "assistant";
        content?: string | Json[];
        tool_calls?: ToolCall[];
        /** Provider output with no field here (reasoning items): send it back as is. */
        provider_items?: Json[];
      }
    | { role: "tool"; tool_call_id: string; content: Json; is_error?: boolean };

  export interface ToolDefinition {
    name: string;
    description?: string;
    /** JSON Schema of the arguments (an object schema). */
    input_schema?: Json;
  }

  /** The normalized chat request, the same for every provider format. */
  export interface ChatRequest {
    provider: string;
    model: string;
    system?: string;
    messages: ChatMessage[];
    tools?: ToolDefinition[];
    tool_choice?: "auto" | "none" | "required" | { name: string };
    max_output_tokens?: number;
    temperature?: number;
    stop?: string[];
    /** Stream token deltas to the actor's live event stream (`event: delta`). */
    stream?: boolean;
    /** Tried in order when the provider is unavailable before its first token. */
    fallbacks?: { provider: string; model: string }[];
    /** Merged into the provider's request body as given. */
    provider_options?: { [key: string]: Json };
  }

  export interface ChatResponse {
    provider: string;
    model: string;
    id?: string;
    /** Ready to append to `messages`. */
    message: Extract<ChatMessage, { role: "assistant" }>;
    stop_reason: "end_turn" | "tool_use" | "max_tokens" | "stop_sequence" | "content_filter" | "refusal" | "other";
    provider_stop_reason?: string;
    usage: { input_tokens: number; output_tokens: number; cost_usd?: number; [detail: string]: Json | undefined };
    provider_fields?: { [key: string]: Json };
    /** Providers tried before this answer, and why they failed. */
    attempts?: { provider: string; model: string; error: string }[];
  }

  /** LLM calls by provider name; the host holds the keys. Errors are thrown
   * with a message like "invalid argument: context_length_exceeded: …". */
  export interface Model {
    chat(request: ChatRequest): Promise<ChatResponse>;
  }

  /** Structured logs into the node's log, tagged with the actor. */
  export interface Log {
    debug(message: string, fields?: Record<string, Json>): void;
    info(message: string, fields?: Record<string, Json>): void;
    warn(message: string, fields?: Record<string, Json>): void;
    error(message: string, fields?: Record<string, Json>): void;
  }

  /** Everything a JavaScript actor or eval script may do. Capabilities not
   * enabled on the node throw an `Error` whose message starts with
   * "unsupported:". */
  export interface Marmot {
    state: State;
    events: Events;
    alarms: Alarms;
    inputs: Inputs;
    actors: Actors;
    files: Files;
    model: Model;
    log: Log;
  }

  export const state: State;
  export const events: Events;
  export const alarms: Alarms;
  export const inputs: Inputs;
  export const actors: Actors;
  export const files: Files;
  export const model: Model;
  export const log: Log;
  const marmot: Marmot;
  export default marmot;
}

/** The same API as the "marmot" module, for eval scripts. Timers
 * (`setTimeout`), `console`, `TextEncoder`/`TextDecoder`, `URL`,
 * `URLSearchParams`, `crypto.getRandomValues`, `fetch` (to the type's
 * allowed hosts; bodies are bytes both ways), `Headers` and `Response`
 * (`text`, `json`, `arrayBuffer`, `bytes`) are the standard ones (use
 * `"lib": ["ES2022", "DOM"]`); timers still pending when a turn ends are
 * dropped. Nothing else of the DOM exists at run time (no `Request`,
 * `Blob`, `FormData` or streaming bodies). */
declare const marmot: import("marmot").Marmot;

// Drive `cellbox serve` with the official MCP TypeScript SDK.
//
//     node ts_client.mjs stdio CELLBOX [SERVE_ARGS...]
//     node ts_client.mjs http URL
//
// Runs the client matrix's checks (tests/suite/clients.rs), one `ok: ...`
// line per check; any failure throws and exits non-zero. The SDK validates
// every structuredContent against the tool's declared outputSchema.
import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { LoggingMessageNotificationSchema } from "@modelcontextprotocol/sdk/types.js";

const sdkPackage = new URL("./node_modules/@modelcontextprotocol/sdk/package.json", import.meta.url);
const version = JSON.parse(readFileSync(sdkPackage, "utf8")).version;
const [mode, target, ...serveArgs] = process.argv.slice(2);
const label = `typescript-sdk-${version} ${mode}`;
const FREED_WITHIN = 20_000; // ms; the cancelled cell would sleep for 120 s
const bigCap = process.env.CELLBOX_BIG_CAP === "1";

const ok = (what) => console.log(`ok: ${label}: ${what}`);
function check(cond, what, detail = "") {
  if (!cond) throw new Error(`${label}: ${what} ${detail}`);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const text = (r) => r.content.map((c) => c.text ?? "").join("");

const transport =
  mode === "stdio"
    ? new StdioClientTransport({ command: target, args: ["serve", ...serveArgs], stderr: "inherit" })
    : new StreamableHTTPClientTransport(new URL(target));
const client = new Client({ name: "cellbox-matrix", version: "1" });
const logs = [];
client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => logs.push(n.params));
await client.connect(transport);

const exec = (args, options = {}) =>
  client.callTool({ name: "execute_code", arguments: args }, undefined, options);

const { tools } = await client.listTools();
const names = new Set(tools.map((t) => t.name));
for (const n of ["execute_code", "create_session", "reset_session", "close_session", "list_sessions"]) {
  check(names.has(n), "tools listed", [...names].join(","));
}
check(
  tools.find((t) => t.name === "execute_code").description.includes("standard library only"),
  "the description says what Python imports",
);
ok("tools/list");

// logging/setLevel: above info, live output is not sent.
const onprogress = () => {};
await client.setLoggingLevel("warning");
let r = await exec({ language: "python", code: "print('live')\n7" }, { onprogress });
check(r.structuredContent.value === 7, "cell with progress", JSON.stringify(r));
check(logs.filter((l) => l.logger === "stdout").length === 0, "no output logged at warning", JSON.stringify(logs));
await client.setLoggingLevel("info");
await exec({ language: "python", code: "print('live')\n7" }, { onprogress });
check(
  logs.some((l) => l.logger === "stdout" && JSON.stringify(l.data).includes("live")),
  "output logged at level info",
  JSON.stringify(logs),
);
ok("logging/setLevel filters the log notifications");

r = await client.callTool({ name: "create_session", arguments: {} });
const sid = r.structuredContent.session_id;
await exec({ language: "python", code: "x = 40", session_id: sid });
r = await exec({ language: "python", code: "x + 2", session_id: sid });
check(!r.isError && r.structuredContent.value === 42, "session value", JSON.stringify(r));
check(text(r).includes("=> 42"), "the value in the text", text(r));
check(!("sandbox" in r.structuredContent), "no sandbox report unless asked");
r = await exec({ language: "python", code: "x", session_id: sid, verbose: true });
check("sandbox" in r.structuredContent && "run" in r.structuredContent, "verbose result");
ok("cells in a session");

r = await exec({ language: "python", code: "1/0" });
check(r.isError && r.structuredContent.error.type === "ZeroDivisionError", "an error", JSON.stringify(r));
ok("an error");

r = await exec({ language: "python", code: "import time\ntime.sleep(30)", timeout_seconds: 1 });
check(r.isError && r.structuredContent.status === "timeout", "timeout status", JSON.stringify(r));
ok("a timeout");

// Abort: the SDK sends notifications/cancelled; the session is free at once.
const sleeper = { language: "python", code: "import time\ntime.sleep(120)", session_id: sid };
const ac = new AbortController();
const pending = exec(sleeper, { signal: ac.signal, timeout: 300_000 }).then(
  () => "ended",
  (e) => `rejected: ${e.message}`,
);
await sleep(1500);
ac.abort("test");
console.log(`   (aborted call: ${await pending})`);
let t0 = Date.now();
r = await exec({ language: "python", code: "x", session_id: sid }, { timeout: FREED_WITHIN });
check(r.structuredContent.value === 40, "the session after a cancel", JSON.stringify(r));
ok(`a cancel frees the session (${(Date.now() - t0) / 1000} s)`);

// A client-side timeout cancels too.
const timedOut = await exec(sleeper, { timeout: 1500 }).then(
  () => "ended",
  (e) => `rejected: ${e.message}`,
);
check(timedOut.startsWith("rejected"), "the client timeout fired", timedOut);
t0 = Date.now();
r = await exec({ language: "python", code: "x", session_id: sid }, { timeout: FREED_WITHIN });
check(r.structuredContent.value === 40, "the session after a client timeout", JSON.stringify(r));
ok(`a client timeout cancels the cell (${(Date.now() - t0) / 1000} s)`);

r = await exec({ language: "python", code: "print('x' * 2_000_000)\n'done'" });
check(!r.isError && r.structuredContent.value === "done", "2 MB output call");
const t = r.structuredContent.truncated.stdout;
check(t && t.total_bytes >= 2_000_000, "2 MB counted", JSON.stringify(t));
const kept = t.kept_head + t.kept_tail;
check(bigCap ? kept < 1_000_000 : kept <= 32 * 1024, "kept output", JSON.stringify(t));
check(text(r).length < 16 * 1024, "a bounded text", String(text(r).length));
ok(`2 MB output (kept ${kept} bytes, text ${text(r).length} chars)`);

// A cell that asks a model (the test's fake endpoint) and one that calls a
// declared tool: their results carry `models` and the calls' details, which
// the output schema must allow (the SDK validates).
r = await exec({ language: "python", code: "model_query('hello')" });
check(!r.isError && r.structuredContent.value === "echo:hello", "a cell that asks a model", JSON.stringify(r));
check(r.structuredContent.models.cell.model_calls === 1, "its model usage", JSON.stringify(r));
r = await exec({ language: "python", code: "tools.shout(text='hi')['stdout']" });
check(!r.isError && r.structuredContent.value === "hi\n", "a cell that calls a tool", JSON.stringify(r));
check(r.structuredContent.models.cell.tool_calls === 1, "its tool usage", JSON.stringify(r));
ok("cells that ask a model and call a declared tool");

await client.callTool({ name: "close_session", arguments: { session_id: sid } });
await client.close();
console.log(`PASS ${label}`);

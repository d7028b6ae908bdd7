// A real MCP 2026-07-28 client for the mcpproxy tests, built on the official
// SDK's v2 client (@modelcontextprotocol/client), which speaks the revision
// without initialize and sessions.
//
//   node client2026.mjs key=value...
//
// Keys:
//   url=URL                 the proxy endpoint (Streamable HTTP)
//   negotiation=pin|auto    pin: 2026-07-28 only, no fallback to initialize (default);
//                           auto: probe with server/discover, fall back if the server is older
//
// Connects to @modelcontextprotocol/server-everything through the proxy, lists
// tools, calls echo and get-sum, and runs a long operation with progress. The
// bearer token comes from $MCP_TOKEN. Prints a JSON summary on stdout and
// exits 0, or prints the failure on stderr and exits 1.

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const opts = Object.fromEntries(
  process.argv.slice(2).map((kv) => {
    const i = kv.indexOf("=");
    return [kv.slice(0, i), kv.slice(i + 1)];
  }),
);

let step = "start";

function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

function textOf(result) {
  return (result.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n");
}

let client;

async function main() {
  const negotiation = opts.negotiation ?? "pin";
  const mode = negotiation === "pin" ? { pin: "2026-07-28" } : negotiation;
  client = new Client({ name: "agent-vm-test-2026", version: "1.0.0" }, { versionNegotiation: { mode } });
  const headers = process.env.MCP_TOKEN ? { Authorization: `Bearer ${process.env.MCP_TOKEN}` } : {};
  const transport = new StreamableHTTPClientTransport(new URL(opts.url), { requestInit: { headers } });
  step = "connect";
  await client.connect(transport);
  const summary = {
    era: client.getProtocolEra(),
    protocolVersion: client.getNegotiatedProtocolVersion(),
    server: client.getServerVersion()?.name,
    sessionId: transport.sessionId ?? null,
  };

  step = "tools/list";
  summary.tools = (await client.listTools()).tools.map((t) => t.name);
  check(summary.tools.includes("echo"), `echo missing from ${summary.tools}`);

  step = "echo";
  summary.echo = textOf(await client.callTool({ name: "echo", arguments: { message: "hello from 2026" } }));
  check(summary.echo === "Echo: hello from 2026", `echo answered ${summary.echo}`);

  step = "get-sum";
  const sum = textOf(await client.callTool({ name: "get-sum", arguments: { a: 2, b: 40 } }));
  check(sum.includes("42"), `get-sum answered ${sum}`);

  step = "trigger-long-running-operation";
  const progress = [];
  const long = await client.callTool(
    { name: "trigger-long-running-operation", arguments: { duration: 0.3, steps: 3 } },
    { onprogress: (p) => progress.push(p.progress) },
  );
  summary.progress = progress;
  check(textOf(long).includes("completed"), `long-running operation answered ${JSON.stringify(long)}`);

  step = "close";
  await client.close();
  return summary;
}

main().then(
  (summary) => {
    process.stdout.write(JSON.stringify(summary) + "\n");
    process.exit(0);
  },
  async (err) => {
    process.stderr.write(`client2026.mjs: failed at ${step}: ${err.stack ?? err}\n`);
    await client?.close().catch(() => {});
    process.exit(1);
  },
);

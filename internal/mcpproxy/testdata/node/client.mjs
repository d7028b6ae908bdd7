// A real MCP client for the mcpproxy tests, built on the official SDK.
//
//   node client.mjs SCENARIO key=value...
//
// Scenarios:
//   everything  connect to @modelcontextprotocol/server-everything through the proxy:
//               list tools, resources and prompts, call echo, get progress from a
//               long-running operation, answer the server's sampling request and
//               its roots/list request
//   filesystem  connect to @modelcontextprotocol/server-filesystem: list_directory
//               and read_text_file on dir=...
//   refused     expect the connection to be refused with status=401|403
//
// Keys:
//   transport=streamable|sse|stdio  how to reach the proxy (stdio: run command=... with
//                                   args=JSON array and env=JSON object, e.g. mcp-remote)
//   url=URL                         the proxy endpoint
//   config=FILE                     read url and headers from a Claude Code .mcp.json entry
//                                   (the first server in it) instead of url and $MCP_TOKEN
//   origin=ORIGIN                   send this Origin header
//   dir=DIR                         filesystem: the directory the server serves
//
// The bearer token comes from $MCP_TOKEN (unset: none is sent). Prints a JSON
// summary on stdout and exits 0, or prints the failure on stderr and exits 1.

import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { SSEClientTransport } from "@modelcontextprotocol/sdk/client/sse.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import {
  CreateMessageRequestSchema,
  ListRootsRequestSchema,
  LoggingMessageNotificationSchema,
} from "@modelcontextprotocol/sdk/types.js";

const [scenario, ...rest] = process.argv.slice(2);
const opts = Object.fromEntries(
  rest.map((kv) => {
    const i = kv.indexOf("=");
    return [kv.slice(0, i), kv.slice(i + 1)];
  }),
);

let step = "start"; // what the client is doing, for failure messages

function fail(msg) {
  throw new Error(msg);
}

function check(cond, msg) {
  if (!cond) fail(msg);
}

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

function endpoint() {
  let url = opts.url;
  const headers = {};
  if (opts.config) {
    const doc = JSON.parse(readFileSync(opts.config, "utf8"));
    const entry = Object.values(doc.mcpServers)[0];
    check(entry.type === "http", `config entry type ${entry.type}, want http`);
    url = entry.url;
    Object.assign(headers, entry.headers);
  } else if (process.env.MCP_TOKEN) {
    headers.Authorization = `Bearer ${process.env.MCP_TOKEN}`;
  }
  if (opts.origin) headers.Origin = opts.origin;
  return { url, headers };
}

function makeTransport() {
  const { url, headers } = endpoint();
  switch (opts.transport) {
    case "streamable":
      return new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
    case "sse":
      return new SSEClientTransport(new URL(url), { requestInit: { headers } });
    case "stdio":
      return new StdioClientTransport({
        command: opts.command,
        args: JSON.parse(opts.args ?? "[]"),
        env: { ...process.env, ...JSON.parse(opts.env ?? "{}") },
        stderr: "inherit",
      });
    default:
      fail(`unknown transport ${opts.transport}`);
  }
}

function textOf(result) {
  return (result.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join("\n");
}

async function everything(client, summary) {
  const logs = [];
  let rootsAsked = 0;
  let rootsLogged;
  const rootsSeen = new Promise((resolve) => (rootsLogged = resolve));
  client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => {
    logs.push(String(n.params.data));
    if (String(n.params.data).startsWith("Roots updated: 1 root(s)")) rootsLogged();
  });
  client.setRequestHandler(ListRootsRequestSchema, async () => {
    rootsAsked++;
    return { roots: [{ uri: "file:///workspace", name: "workspace" }] };
  });
  client.setRequestHandler(CreateMessageRequestSchema, async (req) => {
    const prompt = req.params.messages[0]?.content?.text ?? "";
    return { model: "test-model", role: "assistant", content: { type: "text", text: `sampled: ${prompt}` } };
  });

  step = "tools/list";
  const tools = (await client.listTools()).tools.map((t) => t.name);
  summary.tools = tools;
  for (const want of ["echo", "get-sum", "trigger-long-running-operation", "trigger-sampling-request"]) {
    check(tools.includes(want), `tool ${want} missing from ${tools}`);
  }

  step = "echo";
  const echo = await client.callTool({ name: "echo", arguments: { message: "hello through the proxy" } });
  summary.echo = textOf(echo);
  check(summary.echo === "Echo: hello through the proxy", `echo answered ${JSON.stringify(echo)}`);

  step = "get-sum";
  const sum = await client.callTool({ name: "get-sum", arguments: { a: 2, b: 40 } });
  check(textOf(sum).includes("42"), `get-sum answered ${JSON.stringify(sum)}`);

  step = "trigger-long-running-operation";
  const progress = [];
  const long = await client.callTool(
    { name: "trigger-long-running-operation", arguments: { duration: 3, steps: 3 } },
    undefined,
    { onprogress: (p) => progress.push(p.progress) },
  );
  summary.progress = progress;
  check(textOf(long).includes("completed"), `long-running operation answered ${JSON.stringify(long)}`);
  // The SDK runs notification handlers a microtask late but settles responses
  // at once, so a progress notification that arrives in the same read as the
  // response is dropped by the client itself. The steps are a second apart
  // (0.1 s was too little under CI's load: 2 and 3 came with the response),
  // so only the last may share its read; the ones before it must all be
  // there, in order.
  check(progress.length >= 2 && progress.every((p, i) => p === i + 1), `got progress ${JSON.stringify(progress)}, want 1, 2[, 3]`);

  // The server asks the client to sample while it handles this call.
  step = "trigger-sampling-request";
  const sampled = await client.callTool({ name: "trigger-sampling-request", arguments: { prompt: "ping", maxTokens: 5 } });
  summary.sampling = textOf(sampled);
  check(summary.sampling.includes("sampled: Resource trigger-sampling-request context: ping"), `sampling answered ${summary.sampling}`);

  // Unprompted, after initialization, the server asks for the client's roots
  // and logs how many it got.
  step = "waiting for roots/list";
  await withTimeout(rootsSeen, 15000, "roots/list from the server");
  summary.rootsAsked = rootsAsked;

  step = "resources";
  const resources = (await client.listResources()).resources;
  check(resources.length > 0, "no resources");
  const read = await client.readResource({ uri: resources[0].uri });
  check(read.contents.length > 0, `reading ${resources[0].uri} gave nothing`);
  step = "prompts";
  const prompts = (await client.listPrompts()).prompts;
  check(prompts.length > 0, "no prompts");
  summary.resources = resources.length;
  summary.prompts = prompts.length;
}

async function filesystem(client, summary) {
  check(opts.dir, "filesystem needs dir=");
  const tools = (await client.listTools()).tools.map((t) => t.name);
  summary.tools = tools;
  check(tools.includes("list_directory"), `list_directory missing from ${tools}`);
  const listing = textOf(await client.callTool({ name: "list_directory", arguments: { path: opts.dir } }));
  summary.listing = listing;
  check(listing.includes("[FILE] hello.txt") && listing.includes("[DIR] sub"), `list_directory answered ${listing}`);
  const content = textOf(await client.callTool({ name: "read_text_file", arguments: { path: `${opts.dir}/hello.txt` } }));
  check(content.trim() === "hello from the VM", `read_text_file answered ${content}`);
}

async function refused() {
  const want = Number(opts.status);
  const client = new Client({ name: "agent-vm-test", version: "1.0.0" });
  try {
    await withTimeout(client.connect(makeTransport()), 15000, "connect");
  } catch (err) {
    const code = err.code ?? err.event?.code;
    const text = String(err.message ?? err);
    check(code === want || text.includes(`(HTTP ${want})`) || text.includes(`Non-200 status code (${want})`),
      `connection failed, but not with ${want}: code ${code}: ${text}`);
    await client.close().catch(() => {});
    return { refused: want, error: text };
  }
  await client.close().catch(() => {});
  fail(`connected, but expected HTTP ${want}`);
}

let client; // closed on failure too, so a stdio bridge it started does not linger

async function main() {
  if (scenario === "refused") return refused();
  const summary = { scenario, transport: opts.transport };
  client = new Client(
    { name: "agent-vm-test", version: "1.0.0" },
    { capabilities: scenario === "everything" ? { sampling: {}, roots: { listChanged: true } } : {} },
  );
  const transport = makeTransport();
  step = "connect";
  await withTimeout(client.connect(transport), 30000, "connect");
  summary.server = client.getServerVersion()?.name;
  if (scenario === "everything") await everything(client, summary);
  else if (scenario === "filesystem") await filesystem(client, summary);
  else fail(`unknown scenario ${scenario}`);
  step = "close";
  if (transport.terminateSession) await transport.terminateSession(); // DELETE the session
  await client.close();
  return summary;
}

main().then(
  (summary) => {
    process.stdout.write(JSON.stringify(summary) + "\n");
    process.exit(0);
  },
  async (err) => {
    process.stderr.write(`client.mjs: failed at ${step}: ${err.stack ?? err}\n`);
    await withTimeout(client?.close() ?? Promise.resolve(), 5000, "close").catch(() => {});
    process.exit(1);
  },
);

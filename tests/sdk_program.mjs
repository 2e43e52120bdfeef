// A TypeScript Agent SDK program for tests: runs one query() with solo as its CLI and prints every message it
// receives as a JSON line (the last line: {"done": true} or {"error": "..."}).
//     node tests/sdk_program.mjs SPEC_JSON
// SPEC_JSON: {"sdk": path of @anthropic-ai/claude-agent-sdk, "cli": solo, "cwd", "env", "prompt",
//             "options": more query() options, "calc": true for an in-process MCP server "calc" with tool "add"}
const spec = JSON.parse(process.argv[2]);
const sdk = await import(`${spec.sdk}/sdk.mjs`);
const { z } = await import(`${spec.sdk}/../../zod/index.js`);

const options = { pathToClaudeCodeExecutable: spec.cli, cwd: spec.cwd, env: spec.env, ...spec.options };
if (spec.calc) {
  const add = sdk.tool("add", "Add two numbers", { a: z.number(), b: z.number() },
    async ({ a, b }) => ({ content: [{ type: "text", text: `sum ${a + b}` }] }));
  const calc = sdk.createSdkMcpServer({ name: "calc", version: "1.0.0", tools: [add] });
  options.mcpServers = { ...(options.mcpServers || {}), calc };
}
try {
  for await (const message of sdk.query({ prompt: spec.prompt, options })) {
    console.log(JSON.stringify(message));
  }
  console.log(JSON.stringify({ done: true }));
} catch (error) {
  console.log(JSON.stringify({ error: String(error && error.message || error) }));
}

// Arbor's MCP endpoint checked with the official TypeScript SDK: the
// happy path a client takes and the transport's failure cases (MCP
// specification, basic/transports, Streamable HTTP). Run by
// agent/conformance_test.go:
//
//   node conformance.mjs http://HOST:PORT TASK_A TASK_B INSTRUCTION_A
//
// Prints one line per case, "ok NAME" or "FAIL NAME: why", and exits 1 if
// any case failed.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [base, taskA, taskB, instructionA] = process.argv.slice(2);
if (!instructionA) {
	console.error('usage: node conformance.mjs BASE_URL TASK_A TASK_B INSTRUCTION_A');
	process.exit(2);
}
const urlOf = task => new URL(`${base}/v1/mcp?task=${encodeURIComponent(task)}`);

let failed = 0;
async function check(name, fn) {
	try {
		await fn();
		console.log(`ok ${name}`);
	} catch (e) {
		failed++;
		console.log(`FAIL ${name}: ${e?.stack ?? e}`);
	}
}
function assert(cond, msg) {
	if (!cond) throw new Error(msg);
}
function text(result) {
	return (result.content ?? []).filter(c => c.type === 'text').map(c => c.text).join('');
}
// refusedWith runs fn, which must fail with HTTP status `status`
// (StreamableHTTPError carries it as code).
async function refusedWith(status, fn) {
	let err;
	try {
		await fn();
	} catch (e) {
		err = e;
	}
	assert(err, `served, want HTTP ${status}`);
	assert(err instanceof StreamableHTTPError, `failed with ${err}, want a StreamableHTTPError of HTTP ${status}`);
	assert(err.code === status, `HTTP ${err.code} (${err.message}), want ${status}`);
	return err;
}
function newClient() {
	return new Client({ name: 'arbor-conformance', version: '0' });
}

const client = newClient();
const transport = new StreamableHTTPClientTransport(urlOf(taskA));

await check('connect (initialize, session id)', async () => {
	await client.connect(transport);
	assert(transport.sessionId, 'no Mcp-Session-Id after initialize');
});
await check('capabilities: tools, prompts and resources, no listChanged', async () => {
	const caps = client.getServerCapabilities();
	assert(caps?.tools, `no tools capability: ${JSON.stringify(caps)}`);
	assert(caps?.prompts && caps?.resources, `no prompts or resources capability: ${JSON.stringify(caps)}`);
	for (const k of ['tools', 'prompts', 'resources']) {
		assert(!caps[k].listChanged, `${k}.listChanged advertised, but the server never changes its lists`);
	}
});
await check('tools/list', async () => {
	const names = (await client.listTools()).tools.map(t => t.name).sort();
	const want = ['bash', 'fork_try', 'list_states', 'read_file', 'rollback', 'write_file'];
	assert(JSON.stringify(names) === JSON.stringify(want), `tools ${names}, want ${want}`);
});
await check('tools/call bash (the first result carries the instruction)', async () => {
	const r = await client.callTool({ name: 'bash', arguments: { cmd: 'echo $((6*7))' } });
	assert(!r.isError, `tool error: ${text(r)}`);
	assert(text(r).includes('42'), `no output in ${JSON.stringify(text(r))}`);
	assert(text(r).includes(instructionA), `first result lacks the task's instruction: ${JSON.stringify(text(r))}`);
	assert(r.structuredContent?.exit_code === 0, `structured result: ${JSON.stringify(r.structuredContent)}`);
});
await check('prompts/list and prompts/get task', async () => {
	const names = (await client.listPrompts()).prompts.map(p => p.name);
	assert(names.includes('task'), `prompts ${names}, want task`);
	const p = await client.getPrompt({ name: 'task' });
	const got = p.messages.map(m => m.content?.text ?? '').join('');
	assert(got === instructionA, `prompt task: ${JSON.stringify(got)}, want ${JSON.stringify(instructionA)}`);
});
await check('resources/list and resources/read arbor://task/instruction', async () => {
	const uris = (await client.listResources()).resources.map(r => r.uri);
	assert(uris.includes('arbor://task/instruction'), `resources ${uris}`);
	const r = await client.readResource({ uri: 'arbor://task/instruction' });
	assert(r.contents.length === 1 && r.contents[0].text === instructionA, `resource: ${JSON.stringify(r.contents)}`);
});

await check('foreign Origin: 403', async () => {
	const t = new StreamableHTTPClientTransport(urlOf(taskA), { requestInit: { headers: { Origin: 'https://evil.example' } } });
	await refusedWith(403, () => newClient().connect(t));
});
await check('request without a session id (not initialize): 400', async () => {
	const t = new StreamableHTTPClientTransport(urlOf(taskA));
	await t.start();
	await refusedWith(400, () => t.send({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} }));
	await t.close();
});
await check('session of one task used on another: 400 naming both', async () => {
	const other = new StreamableHTTPClientTransport(urlOf(taskB), { sessionId: transport.sessionId });
	const c = newClient();
	await c.connect(other); // a session id given: the SDK resumes, no initialize
	const err = await refusedWith(400, () => c.listTools());
	assert(err.message.includes(taskA) && err.message.includes(taskB), `message names not both tasks: ${err.message}`);
	await other.close();
});
await check('unknown session id: 404', async () => {
	const t = new StreamableHTTPClientTransport(urlOf(taskA), { sessionId: 'no-such-session' });
	const c = newClient();
	await c.connect(t);
	await refusedWith(404, () => c.listTools());
	await t.close();
});
await check('terminated session: 404', async () => {
	const sid = transport.sessionId;
	await transport.terminateSession();
	await client.close();
	const t = new StreamableHTTPClientTransport(urlOf(taskA), { sessionId: sid });
	const c = newClient();
	await c.connect(t);
	await refusedWith(404, () => c.listTools());
	await t.close();
});

process.exit(failed ? 1 : 0);

// Drives basin gateway's /v1/messages with the official @anthropic-ai/sdk client, as Claude Code
// calls it (its session id in the x-claude-code-session-id header), and prints what it saw as
// JSON. Used by the gateway's Go tests:
//
//   node client.mjs <baseURL> session <session> <words>
//       a call, then a streamed call of the same session. Prints {"calls":[{text, input_tokens,
//       cache_read_input_tokens, cache_creation_input_tokens, output_tokens, events}]}.
//   node client.mjs <baseURL> once <session> <maxRetries> [tenant]
//       one call, the SDK's own retries on; prints {"ok", "status", "error", "type",
//       "retry_after", "should_retry", "elapsed_ms", "attempts"}: attempts are
//       every request the SDK sent (sent_ms, answered_ms, status, retry_after_ms).
//   node client.mjs <baseURL> held <session> <stream: 0|1> <words>
//       one call, streamed or not, of a session the gateway holds. While it waits it says on
//       stderr, a line each, when the response's status arrives ("headers <status>") and each
//       ping event the gateway sends ("keepalive"), so that the test can resume the session
//       once the client has seen them. Prints {"ok", "text", "events", "keepalives", "error"}.
//
// baseURL is the gateway's root (the SDK adds /v1/messages).
import Anthropic from '@anthropic-ai/sdk';

const [baseURL, mode, ...args] = process.argv.slice(2);
if (!baseURL || !mode) {
  console.error('usage: node client.mjs <baseURL> session <session> <words> | once <session> <maxRetries> [tenant] | held <session> <stream: 0|1> <words>');
  process.exit(2);
}

// watching is a fetch that reports on stderr when a response's status arrives and each line of
// its body equal to keepAlive, read from a copy of the body (tee) beside the SDK's own reading.
const watching = (keepAlive) => {
  const seen = { keepalives: 0, done: Promise.resolve() };
  seen.fetch = async (url, init) => {
    const res = await globalThis.fetch(url, init);
    console.error(`headers ${res.status}`);
    if (!res.body) return res;
    const [mine, theirs] = res.body.tee();
    seen.done = (async () => {
      const decoder = new TextDecoder();
      let pending = '';
      for await (const chunk of mine) {
        pending += decoder.decode(chunk, { stream: true });
        const lines = pending.split('\n');
        pending = lines.pop();
        for (const line of lines) {
          if (line === keepAlive) {
            seen.keepalives++;
            console.error('keepalive');
          }
        }
      }
    })().catch(() => {});
    return new Response(theirs, { status: res.status, statusText: res.statusText, headers: res.headers });
  };
  return seen;
};

const options = (session, maxRetries, tenant) => {
  const defaultHeaders = { 'x-claude-code-session-id': session };
  if (tenant) defaultHeaders['x-tenant-id'] = tenant;
  return { baseURL, apiKey: 'sk-ant-test-not-a-real-key', defaultHeaders, maxRetries, timeout: 20_000 };
};

const usageOf = (u, text, events) => ({
  text,
  input_tokens: u.input_tokens,
  cache_read_input_tokens: u.cache_read_input_tokens ?? 0,
  cache_creation_input_tokens: u.cache_creation_input_tokens ?? 0,
  output_tokens: u.output_tokens,
  events,
});

if (mode === 'session') {
  const [session, words = '8'] = args;
  const client = new Anthropic(options(session, 0));
  const body = {
    model: 'basin-sim',
    max_tokens: Number(words),
    system: [{ type: 'text', text: 'You are Claude Code, a coding agent.' }],
    messages: [{ role: 'user', content: 'Fix the failing test in the parser package, please.' }],
    metadata: { user_id: 'user_test_account_test_session_' + session },
  };
  const calls = [];
  const first = await client.messages.create(body);
  calls.push(usageOf(first.usage, first.content.map((b) => b.text ?? '').join(''), 0));

  body.messages.push({ role: 'assistant', content: first.content });
  body.messages.push({ role: 'user', content: [{ type: 'text', text: 'Now run the tests.' }] });
  const stream = await client.messages.create({ ...body, stream: true });
  let text = '';
  let events = 0;
  let usage = {};
  for await (const ev of stream) {
    events++;
    if (ev.type === 'message_start') usage = { ...ev.message.usage };
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
    if (ev.type === 'message_delta') usage.output_tokens = ev.usage.output_tokens;
  }
  calls.push(usageOf(usage, text, events));
  console.log(JSON.stringify({ calls }));
} else if (mode === 'once') {
  const [session, maxRetries = '0', tenant = ''] = args;
  // Every attempt the SDK makes, seen through its fetch: when it was sent, and what came back.
  const attempts = [];
  const t0 = Date.now();
  const fetch = async (url, init) => {
    const sent = Date.now() - t0;
    const res = await globalThis.fetch(url, init);
    attempts.push({ sent_ms: sent, answered_ms: Date.now() - t0, status: res.status,
      retry_after_ms: Number(res.headers.get('retry-after-ms') ?? 0) });
    return res;
  };
  const client = new Anthropic({ ...options(session, Number(maxRetries), tenant), fetch });
  const start = Date.now();
  try {
    const m = await client.messages.create({
      model: 'basin-sim',
      max_tokens: 4,
      messages: [{ role: 'user', content: 'hello' }],
    });
    console.log(JSON.stringify({ ok: true, status: 200, text: m.content[0].text, elapsed_ms: Date.now() - start }));
  } catch (err) {
    console.log(
      JSON.stringify({
        ok: false,
        status: err.status ?? 0,
        error: err.constructor.name,
        type: err.type ?? err.error?.error?.type ?? null,
        retry_after: err.headers?.get?.('retry-after') ?? null,
        should_retry: err.headers?.get?.('x-should-retry') ?? null,
        elapsed_ms: Date.now() - start,
        attempts,
      }),
    );
  }
} else if (mode === 'held') {
  const [session, stream = '0', words = '8'] = args;
  const seen = watching('event: ping');
  const client = new Anthropic({ ...options(session, 0), fetch: seen.fetch, timeout: 30_000 });
  const body = {
    model: 'basin-sim',
    max_tokens: Number(words),
    messages: [{ role: 'user', content: 'Fix the failing test in the parser package, please.' }],
  };
  const out = { ok: false, text: '', events: 0 };
  try {
    if (stream === '1') {
      for await (const ev of await client.messages.create({ ...body, stream: true })) {
        out.events++;
        if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') out.text += ev.delta.text;
      }
    } else {
      const m = await client.messages.create(body);
      out.text = m.content.map((b) => b.text ?? '').join('');
    }
    out.ok = true;
  } catch (err) {
    out.error = `${err.constructor.name}: ${err.message}`;
  }
  await seen.done;
  console.log(JSON.stringify({ ...out, keepalives: seen.keepalives }));
} else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}

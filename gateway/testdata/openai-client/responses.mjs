// Drives basin gateway's /v1/responses with the official openai client and prints what it saw as
// JSON. Used by the gateway's Go tests:
//
//   node responses.mjs <baseURL> chain <words>
//       three turns chained by previous_response_id, no session id (the chain is the session):
//       plain, streamed, plain. Prints {"turns":[{id, text, input_tokens, cached_tokens,
//       output_tokens, events}]}.
//   node responses.mjs <baseURL> once <session> <maxRetries> [tenant]
//       one call, the SDK's own retries on; prints {"ok", "status", "error", "type",
//       "retry_after", "should_retry", "elapsed_ms", "attempts"}: attempts are
//       every request the SDK sent (sent_ms, answered_ms, status, retry_after_ms).
import OpenAI from 'openai';

const [baseURL, mode, ...args] = process.argv.slice(2);
if (!baseURL || !mode) {
  console.error('usage: node responses.mjs <baseURL> chain <words> | once <session> <maxRetries> [tenant]');
  process.exit(2);
}

if (mode === 'chain') {
  const words = Number(args[0] ?? '8');
  const client = new OpenAI({ baseURL, apiKey: 'sk-test-not-a-real-key', maxRetries: 0, timeout: 20_000 });
  const turns = [];
  const record = (r, text, events) =>
    turns.push({
      id: r.id,
      text,
      input_tokens: r.usage.input_tokens,
      cached_tokens: r.usage.input_tokens_details?.cached_tokens ?? 0,
      output_tokens: r.usage.output_tokens,
      events,
    });
  const base = { model: 'basin-sim', max_output_tokens: words };

  const first = await client.responses.create({
    ...base,
    instructions: 'You are a coding agent.',
    input: 'Fix the failing test in the parser package, please.',
  });
  record(first, first.output_text, 0);

  const stream = await client.responses.create({
    ...base,
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'Now run the tests.' }] }],
    previous_response_id: first.id,
    stream: true,
  });
  let text = '';
  let events = 0;
  let done = null;
  for await (const ev of stream) {
    events++;
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed') done = ev.response;
  }
  if (!done) throw new Error('the stream ended without response.completed');
  record(done, text, events);

  const third = await client.responses.create({ ...base, input: 'Commit it.', previous_response_id: done.id });
  record(third, third.output_text, 0);
  console.log(JSON.stringify({ turns }));
} else if (mode === 'once') {
  const [session, maxRetries = '0', tenant = ''] = args;
  const headers = { 'x-session-id': session };
  if (tenant) headers['x-tenant-id'] = tenant;
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
  const client = new OpenAI({
    baseURL,
    apiKey: 'sk-test-not-a-real-key',
    defaultHeaders: headers,
    fetch,
    maxRetries: Number(maxRetries),
    timeout: 20_000,
  });
  const start = Date.now();
  try {
    const r = await client.responses.create({ model: 'basin-sim', input: 'hello', max_output_tokens: 4 });
    console.log(JSON.stringify({ ok: true, status: 200, text: r.output_text, elapsed_ms: Date.now() - start }));
  } catch (err) {
    console.log(
      JSON.stringify({
        ok: false,
        status: err.status ?? 0,
        error: err.constructor.name,
        type: err.type ?? err.error?.type ?? null,
        code: err.code ?? null,
        retry_after: err.headers?.get?.('retry-after') ?? null,
        should_retry: err.headers?.get?.('x-should-retry') ?? null,
        elapsed_ms: Date.now() - start,
        attempts,
      }),
    );
  }
} else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}

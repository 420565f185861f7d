// Makes one chat completion call, streamed or not, with the official openai client, for a
// session the gateway holds, and prints what it saw as JSON. Used by the gateway's Go tests:
//
//   node held.mjs <baseURL> <session> <stream: 0|1> <words>
//
// While the call waits it says on stderr, a line each, when the response's status arrives
// ("headers <status>") and each keep-alive the gateway sends ("keepalive"), so that the test
// can resume the session once the client has seen them. Then it prints {"ok", "text",
// "finish_reason", "chunks", "keepalives", "error"}.
//
// baseURL ends in /v1; words is max_tokens (the simulator answers with exactly that many words).
import OpenAI from 'openai';

const [baseURL, session, stream = '0', words = '8'] = process.argv.slice(2);
if (!baseURL || !session) {
  console.error('usage: node held.mjs <baseURL> <session> <stream: 0|1> <words>');
  process.exit(2);
}

// The SDK reads the response through this fetch; a copy of its body (tee) is read beside it for
// the keep-alive comments, which the SDK's own parser skips.
let keepalives = 0;
let watched = Promise.resolve();
const fetch = async (url, init) => {
  const res = await globalThis.fetch(url, init);
  console.error(`headers ${res.status}`);
  if (!res.body) return res;
  const [mine, theirs] = res.body.tee();
  watched = (async () => {
    const decoder = new TextDecoder();
    let pending = '';
    for await (const chunk of mine) {
      pending += decoder.decode(chunk, { stream: true });
      const lines = pending.split('\n');
      pending = lines.pop();
      for (const line of lines) {
        if (line === ': keep-alive') {
          keepalives++;
          console.error('keepalive');
        }
      }
    }
  })().catch(() => {});
  return new Response(theirs, { status: res.status, statusText: res.statusText, headers: res.headers });
};

const client = new OpenAI({
  baseURL,
  apiKey: 'sk-test-not-a-real-key',
  defaultHeaders: { 'x-session-id': session },
  fetch,
  maxRetries: 0,
  timeout: 30_000,
});
const body = {
  model: 'basin-sim',
  messages: [
    { role: 'system', content: 'You are a coding agent.' },
    { role: 'user', content: `Answer in ${words} words.` },
  ],
  max_tokens: Number(words),
};

const out = { ok: false, text: '', finish_reason: null, chunks: 0 };
try {
  if (stream === '1') {
    const s = await client.chat.completions.create({ ...body, stream: true });
    for await (const chunk of s) {
      out.chunks++;
      for (const choice of chunk.choices ?? []) {
        out.text += choice.delta?.content ?? '';
        if (choice.finish_reason) out.finish_reason = choice.finish_reason;
      }
    }
  } else {
    const c = await client.chat.completions.create(body);
    out.text = c.choices[0].message.content;
    out.finish_reason = c.choices[0].finish_reason;
  }
  out.ok = true;
} catch (err) {
  out.error = `${err.constructor.name}: ${err.message}`;
}
await watched;
console.log(JSON.stringify({ ...out, keepalives }));

// Streams one chat completion through basin gateway with the official openai client and prints
// {"content": …, "finish_reason": …, "chunks": …} as JSON. Used by the gateway's Go tests:
//
//   node client.mjs <baseURL> [words] [session-id]
//
// baseURL ends in /v1 (http://127.0.0.1:8080/v1); words is max_tokens (the simulator answers with
// exactly that many words).
import OpenAI from 'openai';

const [baseURL, words = '12', session = 'openai-node-session'] = process.argv.slice(2);
if (!baseURL) {
  console.error('usage: node client.mjs <baseURL> [words] [session-id]');
  process.exit(2);
}

const client = new OpenAI({
  baseURL,
  apiKey: 'sk-test-not-a-real-key',
  defaultHeaders: { 'x-session-id': session },
  maxRetries: 0,
  timeout: 20_000,
});

const stream = await client.chat.completions.create(
  {
    model: 'basin-sim',
    messages: [
      { role: 'system', content: 'You are a coding agent.' },
      { role: 'user', content: `Answer in ${words} words.` },
    ],
    max_tokens: Number(words),
    stream: true,
  },
  { headers: { 'x-session-end': 'true' } },
);

let content = '';
let finishReason = null;
let chunks = 0;
for await (const chunk of stream) {
  chunks++;
  for (const choice of chunk.choices ?? []) {
    content += choice.delta?.content ?? '';
    if (choice.finish_reason) finishReason = choice.finish_reason;
  }
}
console.log(JSON.stringify({ content, finish_reason: finishReason, chunks }));

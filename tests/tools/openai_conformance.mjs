// Conformance of anchorage-server with the official `openai` npm client.
// usage: node openai_conformance.mjs BASE_URL MODEL   (the server runs with --test-replies, see test_server.cpp)
// Exits 0 when every check holds; prints the first failed check and exits 1 otherwise.
import OpenAI from "openai";
import assert from "node:assert/strict";
import { deflateSync } from "node:zlib";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0 });

const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather of a city",
    parameters: { type: "object", properties: { city: { type: "string" }, days: { type: "integer" } }, required: ["city"] },
  },
}];

function checkUsage(usage) {
  assert.equal(typeof usage.prompt_tokens, "number");
  assert.equal(typeof usage.completion_tokens, "number");
  assert.ok(usage.prompt_tokens > 0, "prompt_tokens > 0");
  assert.ok(usage.completion_tokens > 0, "completion_tokens > 0");
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
  assert.equal(typeof usage.prompt_tokens_details.cached_tokens, "number");
  const a = usage.anchorage;
  assert.ok(a, "usage.anchorage present");
  for (const k of ["cache_tier", "cache_source"]) assert.equal(typeof a[k], "string", k);
  for (const k of ["cached_tokens", "reread_tokens", "served_prompt_tokens", "prefill_ms", "ttft_ms", "decode_tokens_per_s"]) assert.equal(typeof a[k], "number", k);
  assert.equal(a.cached_tokens + a.reread_tokens, a.served_prompt_tokens, "cached + re-read = the prompt the engine ran");
  assert.equal(usage.prompt_tokens_details.cached_tokens, Math.max(0, usage.prompt_tokens - a.reread_tokens), "cached_tokens = prompt_tokens - forwarded");
  assert.equal(usage.prompt_tokens_details.cached_tokens, Math.min(a.cached_tokens, usage.prompt_tokens));
}

// Collects a chat stream into one message, checking every chunk's shape on the way.
async function collect(stream) {
  const out = { content: "", reasoning: "", toolCalls: [], finish: null, usage: null, chunks: 0, role: null };
  for await (const chunk of stream) {
    out.chunks++;
    assert.equal(chunk.object, "chat.completion.chunk");
    assert.ok(chunk.id.startsWith("chatcmpl-"));
    assert.equal(chunk.model, model);
    if (chunk.usage) {
      assert.deepEqual(chunk.choices, [], "the usage chunk has no choices");
      out.usage = chunk.usage;
      continue;
    }
    assert.equal(chunk.choices.length, 1);
    const c = chunk.choices[0];
    assert.equal(out.finish, null, "nothing after finish_reason but the usage chunk");
    if (c.delta.role) out.role = c.delta.role;
    if (c.delta.content) out.content += c.delta.content;
    if (c.delta.reasoning_content) out.reasoning += c.delta.reasoning_content;
    for (const tc of c.delta.tool_calls ?? []) {
      if (!out.toolCalls[tc.index]) out.toolCalls[tc.index] = { id: tc.id, name: "", arguments: "" };
      if (tc.function?.name) out.toolCalls[tc.index].name += tc.function.name;
      if (tc.function?.arguments) out.toolCalls[tc.index].arguments += tc.function.arguments;
    }
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  assert.equal(out.role, "assistant");
  assert.notEqual(out.finish, null, "a finish_reason arrived");
  return out;
}

const checks = [];
async function check(name, fn) {
  try {
    await fn();
    checks.push(name);
  } catch (e) {
    console.error(`FAILED ${name}: ${e.stack ?? e}`);
    process.exit(1);
  }
}

await check("models", async () => {
  const list = await client.models.list();
  assert.equal(list.data[0].id, model);
});

await check("plain completion", async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Say hi" }], max_tokens: 8, temperature: 0 });
  assert.equal(r.object, "chat.completion");
  assert.ok(r.id.startsWith("chatcmpl-"));
  assert.equal(r.choices[0].message.role, "assistant");
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.usage.completion_tokens, 8);
  checkUsage(r.usage);
});

await check("streamed completion with include_usage", async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Say hi" }], max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  const out = await collect(stream);
  assert.equal(out.finish, "length");
  assert.ok(out.usage, "usage chunk present");
  assert.equal(out.usage.completion_tokens, 8);
  checkUsage(out.usage);
  const plain = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Say hi" }], max_tokens: 8, temperature: 0 });
  assert.equal(out.reasoning, plain.choices[0].message.reasoning_content ?? "", "stream and non-stream give the same greedy text");
});

async function toolRoundTrip(stream) {
  const messages = [
    { role: "system", content: "You are a weather bot." },
    { role: "user", content: "What is the weather in Paris?" },
  ];
  let call;
  if (stream) {
    const out = await collect(await client.chat.completions.create({ model, messages, tools, stream: true, stream_options: { include_usage: true } }));
    assert.equal(out.finish, "tool_calls");
    assert.equal(out.toolCalls.length, 1);
    assert.equal(out.reasoning, "The user wants the weather, so I call the tool.");
    checkUsage(out.usage);
    call = { id: out.toolCalls[0].id, type: "function", function: { name: out.toolCalls[0].name, arguments: out.toolCalls[0].arguments } };
  } else {
    const r = await client.chat.completions.create({ model, messages, tools });
    assert.equal(r.choices[0].finish_reason, "tool_calls");
    assert.equal(r.choices[0].message.reasoning_content, "The user wants the weather, so I call the tool.");
    assert.equal(r.choices[0].message.tool_calls.length, 1);
    checkUsage(r.usage);
    call = r.choices[0].message.tool_calls[0];
  }
  assert.ok(call.id.startsWith("call_"));
  assert.equal(call.type, "function");
  assert.equal(call.function.name, "get_weather");
  assert.deepEqual(JSON.parse(call.function.arguments), { city: "Paris", days: 2 });
  messages.push({ role: "assistant", content: null, tool_calls: [call] });
  messages.push({ role: "tool", tool_call_id: call.id, content: "{\"temp_c\": 22, \"sky\": \"sunny\"}" });
  if (stream) {
    const out = await collect(await client.chat.completions.create({ model, messages, tools, stream: true }));
    assert.equal(out.finish, "stop");
    assert.equal(out.content, "It is 22 degrees and sunny in Paris.");
    assert.equal(out.toolCalls.length, 0);
  } else {
    const r = await client.chat.completions.create({ model, messages, tools });
    assert.equal(r.choices[0].finish_reason, "stop");
    assert.equal(r.choices[0].message.content, "It is 22 degrees and sunny in Paris.");
    assert.equal(r.choices[0].message.tool_calls, undefined);
  }
}

await check("tool round trip", () => toolRoundTrip(false));
await check("tool round trip streamed", () => toolRoundTrip(true));

await check("text completion", async () => {
  const r = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 5, temperature: 0 });
  assert.equal(r.object, "text_completion");
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(typeof r.choices[0].text, "string");
  assert.equal(r.usage.completion_tokens, 5);
});

await check("logprobs", async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Say hi" }], max_tokens: 4, temperature: 0, logprobs: true, top_logprobs: 3 });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, 4);
  for (const t of content) {
    assert.equal(t.top_logprobs.length, 3);
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs[0].logprob, t.logprob, "greedy picks the best alternative");
  }
});

// A width x height RGB PNG of a gradient, as a data: URL.
function pngDataUrl(width, height) {
  const table = Array.from({ length: 256 }, (_, n) => {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    return c >>> 0;
  });
  const crc = (bytes) => {
    let c = 0xffffffff;
    for (const b of bytes) c = table[(c ^ b) & 0xff] ^ (c >>> 8);
    return (c ^ 0xffffffff) >>> 0;
  };
  const chunk = (type, data) => {
    const body = Buffer.concat([Buffer.from(type, "ascii"), data]);
    const out = Buffer.alloc(12 + data.length);
    out.writeUInt32BE(data.length, 0);
    body.copy(out, 4);
    out.writeUInt32BE(crc(body), 8 + data.length);
    return out;
  };
  const header = Buffer.alloc(13);
  header.writeUInt32BE(width, 0);
  header.writeUInt32BE(height, 4);
  header.set([8, 2, 0, 0, 0], 8);  // 8 bits, RGB
  const rows = Buffer.alloc(height * (1 + width * 3));
  for (let y = 0; y < height; y++)
    for (let x = 0; x < width; x++) rows.set([x & 255, y & 255, (x + y) & 255], y * (1 + width * 3) + 1 + x * 3);
  const png = Buffer.concat([Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]), chunk("IHDR", header), chunk("IDAT", deflateSync(rows)), chunk("IEND", Buffer.alloc(0))]);
  return "data:image/png;base64," + png.toString("base64");
}

await check("an image in a data: URL", async () => {
  const image = pngDataUrl(256, 256);
  const content = [{ type: "text", text: "What is in the picture?" }, { type: "image_url", image_url: { url: image } }];
  const r = await client.chat.completions.create({ model, messages: [{ role: "user", content }], max_tokens: 4, temperature: 0 });
  assert.equal(r.choices[0].message.role, "assistant");
  assert.ok(r.usage.prompt_tokens >= 64, "the image's 64 rows are in the prompt");
  checkUsage(r.usage);
  const cut = image.slice(0, image.length / 2);
  await assert.rejects(client.chat.completions.create({ model, messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: cut } }] }] }),
    (e) => e.status === 400 && e.code === "invalid_image");
});

await check("errors are APIError with OpenAI's shape", async () => {
  await assert.rejects(client.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "x" }] }),
    (e) => e.status === 404 && e.code === "model_not_found" && e.param === "model");
  await assert.rejects(client.chat.completions.create({ model, messages: [] }), (e) => e.status === 400 && e.param === "messages");
});

console.log(JSON.stringify({ passed: checks }));

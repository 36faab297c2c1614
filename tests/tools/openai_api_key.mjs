// The official `openai` npm client against anchorage-server started with --api-key.
// usage: node openai_api_key.mjs BASE_URL MODEL KEY   Exits 0 when every check holds.
import OpenAI from "openai";
import assert from "node:assert/strict";

const [baseURL, model, key] = process.argv.slice(2);
const messages = [{ role: "user", content: "Say hello" }];

const good = new OpenAI({ baseURL, apiKey: key, maxRetries: 0 });
const reply = await good.chat.completions.create({ model, messages, max_tokens: 3, temperature: 0 });
assert.equal(reply.object, "chat.completion");
assert.ok(reply.usage.completion_tokens > 0);
let chunks = 0;
for await (const chunk of await good.chat.completions.create({ model, messages, max_tokens: 3, stream: true })) {
  assert.equal(chunk.object, "chat.completion.chunk");
  chunks += 1;
}
assert.ok(chunks > 1, "a streamed reply");
const models = await good.models.list();
assert.equal(models.data[0].id, model);

for (const apiKey of ["wrong-" + key, key + "x"]) {
  const bad = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
  await assert.rejects(bad.chat.completions.create({ model, messages, max_tokens: 3 }), (e) => {
    assert.ok(e instanceof OpenAI.AuthenticationError, `AuthenticationError, got ${e.constructor.name}`);
    assert.equal(e.status, 401);
    assert.equal(e.code, "invalid_api_key");
    assert.match(e.message, /API key/);
    return true;
  });
}
console.log("api key checks passed");

// js-hello: a Sweep handler in JavaScript, built with componentize-js into a WASI 0.2
// component, using nothing but the `wasi:cli` imports (no helper).
//
// Payload {"name": "Ada"} -> {"greeting": "Hello, Ada!", "attempt": 1}; without "name" it greets
// the world. A payload that is not a JSON object, or a "name" that is not a string, is a
// permanent failure: exit 100 with a one-line reason as the last line of stderr.
//
// Build (docs/guests.md): componentize-js --wit guests/wit -n handler -o js-hello.wasm guests/js-hello/handler.js

import { getEnvironment } from 'wasi:cli/environment@0.2.12';
import { exitWithCode } from 'wasi:cli/exit@0.2.12';
import { getStdin } from 'wasi:cli/stdin@0.2.12';
import { getStdout } from 'wasi:cli/stdout@0.2.12';

function fail(message) {
  console.error(message);
  exitWithCode(100);
}

function readStdin() {
  const stdin = getStdin();
  let text = '';
  const decoder = new TextDecoder();
  for (;;) {
    let chunk;
    try {
      chunk = stdin.blockingRead(65536n);
    } catch (e) {
      // The stream's end is the `closed` case of its error.
      if ((e.payload ?? e).tag === 'closed') return text + decoder.decode();
      throw e;
    }
    text += decoder.decode(chunk, { stream: true });
  }
}

export const run = {
  run() {
    let payload;
    try {
      payload = JSON.parse(readStdin());
    } catch (e) {
      return fail(`the payload is not JSON: ${e.message}`);
    }
    if (payload === null || typeof payload !== 'object' || Array.isArray(payload)) {
      return fail('the payload is not a JSON object');
    }
    const name = payload.name ?? 'world';
    if (typeof name !== 'string') return fail('name must be a string');
    const task = Object.fromEntries(getEnvironment());
    console.error(`js-hello: task ${task.SWEEP_TASK_ID}`);
    const result = { greeting: `Hello, ${name}!`, attempt: Number(task.SWEEP_ATTEMPT) };
    // Not console.log: stdout is the result, written whole, at most 4096 bytes per call.
    const bytes = new TextEncoder().encode(JSON.stringify(result) + '\n');
    for (let at = 0; at < bytes.length; at += 4096) {
      getStdout().blockingWriteAndFlush(bytes.subarray(at, at + 4096));
    }
  },
};

// Sweep's guest contract for JavaScript handlers built with componentize-js (WASI 0.2
// components).
//
// The contract (docs/guests.md): the payload is a JSON object on stdin, the result one JSON
// value on stdout, logs go to stderr (console.error), and the exit code decides the outcome: 0
// succeeded, 100 failed for good (retrying cannot help), anything else failed and may be
// retried. The last line of stderr is the failure's message.
//
//   import { handler, Permanent } from './sweep-guest.js';
//   export const run = handler(async (payload) => ({ greeting: `hello ${payload.name}` }));
//
// `run` is the `wasi:cli/run` export. The handler may be async (componentize-js runs the event
// loop until its promise settles, so `fetch` works); throwing `Permanent` exits 100, `Retry` or
// any other error exits 1 (retried). `env(name)` reads the task's environment (its secrets
// arrive that way). console.log writes to stdout, which is the result: log with console.error.

import { getEnvironment } from 'wasi:cli/environment@0.2.12';
import { exitWithCode } from 'wasi:cli/exit@0.2.12';
import { getStdin } from 'wasi:cli/stdin@0.2.12';
import { getStdout } from 'wasi:cli/stdout@0.2.12';
import { getStderr } from 'wasi:cli/stderr@0.2.12';

/** Exit code of a failure that must not be retried. */
export const PERMANENT = 100;
/** Exit code of a failure worth retrying. */
export const RETRYABLE = 1;

/** A failure retrying cannot fix (bad payload, a 4xx answer): the task exits 100. */
export class Permanent extends Error {}

/** A failure worth retrying (a 5xx, a timeout): the task exits 1. */
export class Retry extends Error {}

/** The task's environment variable `name`, or undefined. */
export function env(name) {
  for (const [key, value] of getEnvironment()) {
    if (key === name) return value;
  }
  return undefined;
}

function isClosed(e) {
  const payload = e && (e.payload ?? e);
  return payload && payload.tag === 'closed';
}

/** Stdin read to the end, as bytes. */
export function readStdin() {
  const stdin = getStdin();
  const chunks = [];
  let length = 0;
  for (;;) {
    let chunk;
    try {
      chunk = stdin.blockingRead(65536n);
    } catch (e) {
      if (isClosed(e)) break;
      throw e;
    }
    chunks.push(chunk);
    length += chunk.length;
  }
  const all = new Uint8Array(length);
  let at = 0;
  for (const chunk of chunks) {
    all.set(chunk, at);
    at += chunk.length;
  }
  return all;
}

/** The payload: stdin parsed as a JSON object (anything else is `Permanent`). */
export function payload() {
  let value;
  try {
    value = JSON.parse(new TextDecoder().decode(readStdin()));
  } catch (e) {
    throw new Permanent(`the payload is not JSON: ${e.message}`);
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new Permanent('the payload is not a JSON object');
  }
  return value;
}

// `blocking-write-and-flush` takes at most 4096 bytes per call.
function writeAll(stream, bytes) {
  for (let at = 0; at < bytes.length; at += 4096) {
    stream.blockingWriteAndFlush(bytes.subarray(at, at + 4096));
  }
}

/** Writes `result` as the task's JSON result. */
export function finish(result) {
  writeAll(getStdout(), new TextEncoder().encode(JSON.stringify(result) + '\n'));
}

/** Ends the task with exit `code` and `message` as the last line of stderr. */
export function fail(message, code) {
  writeAll(getStderr(), new TextEncoder().encode(String(message).replace(/\n/g, ' ') + '\n'));
  exitWithCode(code);
}

/** The `wasi:cli/run` export that runs `handle(payload)` under the guest contract. */
export function handler(handle) {
  return {
    async run() {
      let result;
      try {
        result = await handle(payload());
      } catch (e) {
        if (e instanceof Permanent) fail(e.message || 'permanent failure', PERMANENT);
        else if (e instanceof Retry) fail(e.message || 'failed; retry', RETRYABLE);
        else fail(`${e && e.name ? e.name : 'Error'}: ${e && e.message ? e.message : e}`, RETRYABLE);
        return;
      }
      finish(result);
    },
  };
}

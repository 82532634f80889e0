// js-fetch: a Sweep handler in JavaScript (componentize-js, WASI 0.2 component) that sends one
// email through a mail provider's HTTP API with `fetch`: the same contract as the Rust
// `send-email` component (components/send-email), through the helper module
// guests/lib/js/sweep-guest.js. Sweep sends the request only where the tenant's egress list
// allows.
//
// - payload: a JSON object, posted as the request body as it is, except the optional
//   "mail_api_url" field, which says where to post it and is taken out first; without it the
//   MAIL_API_URL environment variable says where;
// - credential: the MAIL_API_KEY secret (an environment variable the module names at upload),
//   sent as `Authorization: Bearer <key>`;
// - result: {"message_id": <the response's "id">, "status": <HTTP status>};
// - failures: a bad payload, no key, no URL or a 4xx other than 408/429 exit 100; a refused or
//   failed request, a 408/429/5xx or an answer without an id exit 1 (retried).

import { env, handler, Permanent, Retry } from '../lib/js/sweep-guest.js';

async function send(mail) {
  let url = mail.mail_api_url;
  delete mail.mail_api_url;
  if (url === undefined) {
    url = env('MAIL_API_URL');
    if (url === undefined) {
      throw new Permanent('no mail API: set mail_api_url in the payload or MAIL_API_URL');
    }
  } else if (typeof url !== 'string') {
    throw new Permanent('mail_api_url must be a string');
  }
  const key = env('MAIL_API_KEY');
  if (key === undefined) {
    throw new Permanent('MAIL_API_KEY is not set: name it as a secret of the module');
  }

  let response;
  try {
    response = await fetch(url, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify(mail),
    });
  } catch (e) {
    throw new Retry(`POST ${url} failed: ${e.message}`);
  }
  const text = await response.text();
  const status = response.status;
  if (!response.ok) {
    const message = `${url} answered ${status}: ${text.slice(0, 300)}`;
    if (status >= 500 || status === 408 || status === 429) throw new Retry(message);
    throw new Permanent(message);
  }
  let answer;
  try {
    answer = JSON.parse(text);
  } catch (e) {
    throw new Retry(`${url} answered ${status} with no JSON: ${e.message}`);
  }
  if (answer === null || answer.id === undefined || answer.id === null) {
    throw new Retry(`${url} answered ${status} without an id: ${text.slice(0, 300)}`);
  }
  return { message_id: answer.id, status };
}

export const run = handler(send);

"""python-send: a Sweep handler in Python (componentize-py, WASI 0.2 component) that sends one
email through a mail provider's HTTP API: the same contract as the Rust `send-email`
component (components/send-email), with `wasi:http` through the helper module
guests/lib/python/sweep_guest.py.

- payload: a JSON object, posted as the request body as it is, except the optional
  "mail_api_url" field, which says where to post it and is taken out first; without it the
  MAIL_API_URL environment variable says where;
- credential: the MAIL_API_KEY secret (an environment variable the module names at upload),
  sent as `Authorization: Bearer <key>`;
- result: {"message_id": <the response's "id">, "status": <HTTP status>};
- failures: a bad payload, no key, no URL or a 4xx other than 408/429 exit 100 (retrying
  would send the same thing); a refused or failed request (HttpRequestDenied for a host off
  the tenant's egress list), a 408/429/5xx or an answer without an id exit 1 (retried).
"""

import json

import sweep_guest
from sweep_guest import Permanent, Retry


def send(mail):
    url = mail.pop("mail_api_url", None)
    if url is None:
        url = sweep_guest.env("MAIL_API_URL")
        if url is None:
            raise Permanent("no mail API: set mail_api_url in the payload or MAIL_API_URL")
    elif not isinstance(url, str):
        raise Permanent("mail_api_url must be a string")
    key = sweep_guest.env("MAIL_API_KEY")
    if key is None:
        raise Permanent("MAIL_API_KEY is not set: name it as a secret of the module")

    try:
        response = sweep_guest.request(
            "POST",
            url,
            headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
            body=json.dumps(mail).encode(),
        )
    except ValueError as e:
        raise Permanent(f"bad request to {url}: {e}") from None
    except sweep_guest.HttpError as e:
        raise Retry(f"POST {url} failed: {e}") from None

    text = response.body.decode("utf-8", "replace")
    if not 200 <= response.status < 300:
        message = f"{url} answered {response.status}: {text[:300]}"
        if response.status >= 500 or response.status in (408, 429):
            raise Retry(message)
        raise Permanent(message)
    try:
        answer = json.loads(text)
    except ValueError as e:
        raise Retry(f"{url} answered {response.status} with no JSON: {e}") from None
    message_id = answer.get("id") if isinstance(answer, dict) else None
    if message_id is None:
        raise Retry(f"{url} answered {response.status} without an id: {text[:300]}")
    return {"message_id": message_id, "status": response.status}


Run = sweep_guest.command(send)

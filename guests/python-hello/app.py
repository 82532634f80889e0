"""python-hello: a Sweep handler in Python, built with componentize-py into a WASI 0.2
component, using nothing but the standard library and the `wasi:cli` bindings (no helper).

Payload {"name": "Ada"} -> {"greeting": "Hello, Ada!", "attempt": 1}; without "name" it greets
the world. A payload that is not a JSON object, or a "name" that is not a string, is a
permanent failure: exit 100 with a one-line reason as the last line of stderr.

Build (docs/guests.md): componentize-py -d guests/wit -w handler componentize -p guests/python-hello app -o python-hello.wasm
"""

import json
import sys

from wit_world import exports
from wit_world.imports import environment, exit


def fail(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    # `sys.exit(100)` would reach the host as plain failure (1); this carries the code.
    exit.exit_with_code(100)


class Run(exports.Run):
    def run(self) -> None:
        try:
            payload = json.loads(sys.stdin.buffer.read())
        except ValueError as e:
            return fail(f"the payload is not JSON: {e}")
        if not isinstance(payload, dict):
            return fail("the payload is not a JSON object")
        name = payload.get("name", "world")
        if not isinstance(name, str):
            return fail("name must be a string")
        # The task's environment is read at run time: os.environ is the build's snapshot.
        task = dict(environment.get_environment())
        print(f"python-hello: task {task.get('SWEEP_TASK_ID')}", file=sys.stderr)
        print(json.dumps({"greeting": f"Hello, {name}!", "attempt": int(task["SWEEP_ATTEMPT"])}))
        sys.stdout.flush()

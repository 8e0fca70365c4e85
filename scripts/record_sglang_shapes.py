"""Records what the real SGLang 0.5.23 answers, on this CPU, as the simulator's reference shapes.

    python scripts/record_sglang_shapes.py [--out tests/fixtures/sglang-0.5.23-cpu]

Builds (or finds) the CPU venv and a tiny random-weight Llama (``sglang_cpu_env.py``), starts a
real server, sends each request of :data:`REQUESTS` and the reads of :data:`READS`, and writes one
JSON file per exchange: ``{"request": ..., "status": ..., "response": ...}``. Values that change
from run to run (ids, times, throughputs, paths, ports, logprob numbers) are replaced by a fixed
value of the same type; every key is kept, and lists keep their length. ``/metrics`` is kept as
its sample names with their label names. ``tests/test_real_shapes.py`` compares the simulator's
answers to the same requests with these, key by key. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sglang_cpu_env as env  # noqa: E402

DEFAULT_OUT = HERE.parent / "tests" / "fixtures" / f"sglang-{env.SGLANG_VERSION}-cpu"
PROMPT = [1, 100, 200, 300, 400, 500, 600, 700]
# name -> the /generate body. The abort is sent by _record_abort (a request, then its abort).
REQUESTS: dict[str, dict[str, Any]] = {
    "generate_plain": {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True},
    },
    "generate_logprobs": {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "ignore_eos": True},
        "return_logprob": True,
        "top_logprobs_num": 3,
    },
    "generate_logprobs_start0": {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True},
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 3,
    },
}
ABORT_BODY: dict[str, Any] = {
    "rid": "recorded-abort",
    "input_ids": PROMPT,
    "sampling_params": {"max_new_tokens": 3000, "temperature": 1.0, "ignore_eos": True},
}
READS = {
    "server_info": "/server_info",
    "get_model_info": "/get_model_info",
    "v1_loads": "/v1/loads",
    "metrics": "/metrics",
}
# Keys whose values differ run to run: replaced by a fixed value of the same type.
VOLATILE = re.compile(
    r"(^id$|^rid$|_ts$|time|latency|throughput|timestamp|^ts_tic$|_tic$|seconds|^pid$|port$|"
    r"^random_seed$|^host$|^uptime|^gen_throughput$|^last_gen_throughput$|"
    r"_gb$|^weight$|^token_usage$|^utilization$|^kv_cache_usage$|^logprob$|_us$|^decode_moments$|"
    r"^cache_hit_rate$|uncached_tokens$|^startup_available$|^launch_command$)"
)


def _fixed(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return 0
    if isinstance(value, float):
        return 0.0
    if isinstance(value, str):
        return "<volatile>"
    if isinstance(value, list):
        return [_fixed(item) for item in value]
    if isinstance(value, dict):
        return {key: _fixed(item) for key, item in value.items()}
    return value


def scrub(value: Any, replacements: dict[str, str], key: str = "") -> Any:
    """``value`` with its volatile parts fixed: every key and list length kept. ``replacements``
    maps run-specific strings (the model's folder, the scratch folder) to fixed ones."""
    if isinstance(value, list) and (key.endswith("token_logprobs") or key.endswith("top_logprobs")):
        return [_logprob_entry(item) for item in value]
    if VOLATILE.search(key):
        return _fixed(value)
    if isinstance(value, dict):
        return {k: scrub(v, replacements, k) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(item, replacements, key) for item in value]
    if isinstance(value, str):
        for found, fixed in replacements.items():
            value = value.replace(found, fixed)
    return value


def _logprob_entry(entry: Any) -> Any:
    # [logprob, token_id, text]: the number's type is kept (null for the first input token)
    if isinstance(entry, list) and entry and isinstance(entry[0], list):
        return [_logprob_entry(item) for item in entry]
    if isinstance(entry, list) and len(entry) == 3:
        logprob, token, text = entry
        return [None if logprob is None else 0.0, token, text]
    return entry


def metric_names(text: str) -> list[str]:
    """``/metrics`` as its samples' names with their label names, sorted: ``name{a,b}``."""
    found = set()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, labels = line.partition("{")
        if labels:
            keys = sorted(re.findall(r'(\w+)="', labels.rsplit("}", 1)[0]))
            found.add(f"{name}{{{','.join(keys)}}}")
        else:
            found.add(name.split()[0])
    return sorted(found)


def _call(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    if body is not None:
        request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=120) as answer:
        raw = answer.read().decode()
        kind = answer.headers.get("Content-Type", "")
        return answer.status, json.loads(raw) if "json" in kind else raw


def _record_abort(url: str) -> dict[str, Any]:
    answer: dict[str, Any] = {}

    def send() -> None:
        answer["status"], answer["response"] = _call(f"{url}/generate", ABORT_BODY)

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(2.0)  # decoding by now: the abort cuts a running request
    abort_status, abort_response = _call(f"{url}/abort_request", {"rid": ABORT_BODY["rid"]})
    sender.join(timeout=120)
    return {
        "request": ABORT_BODY,
        "abort_request": {"rid": ABORT_BODY["rid"]},
        "abort_status": abort_status,
        "abort_response": abort_response,
        **answer,
    }


def record(url: str, replacements: dict[str, str], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    exchanges: dict[str, dict[str, Any]] = {}
    for name, body in REQUESTS.items():
        status, response = _call(f"{url}/generate", body)
        exchanges[name] = {"request": body, "status": status, "response": response}
    exchanges["generate_abort"] = _record_abort(url)
    for name, path in READS.items():
        status, response = _call(f"{url}{path}")
        if name == "metrics":
            response = metric_names(response)
        exchanges[name] = {"request": {"method": "GET", "path": path}, "status": status,
                           "response": response}  # fmt: skip
    for name, exchange in exchanges.items():
        target = out / f"{name}.json"
        # the requests are kept as sent: the simulator is asked the same
        scrubbed = {
            k: scrub(v, replacements) if "response" in k else v for k, v in exchange.items()
        }
        target.write_text(json.dumps(scrubbed, indent=1, sort_keys=True) + "\n")
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--model", type=Path, help="serve this model (default: a random Llama)")
    args = parser.parse_args(argv)
    try:
        venv = env.ensure_venv(log=lambda line: print(line, file=sys.stderr))
        with tempfile.TemporaryDirectory(prefix="sglang-shapes-") as scratch:
            model = args.model or env.build_random_model(
                HERE.parent / "src" / "eagledata" / "assets" / "tokenizer" / "tiny-chatml",
                Path(scratch) / "model",
                venv,
            )
            with env.Server(Path(model), Path(scratch) / "server", venv=venv) as server:
                print(f"server ready in {server.ready_seconds:.0f} s", file=sys.stderr)
                fixed = {str(model): "<model>", scratch: "<scratch>"}
                for path in record(server.url, fixed, args.out):
                    print(path)
    except env.SetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

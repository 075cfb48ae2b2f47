"""How each host's service is doing, seen from the controller over its HTTP API."""

from __future__ import annotations

import time

import requests

from sparkfleet.fleet.metrics import read_metrics
from sparkfleet.contract import engines, paths, serving
from sparkfleet.contract.reach import api_reachable, api_url
from sparkfleet.contract.shared import probes
from sparkfleet.contract.settings import Settings
from sparkfleet.tables import literal


def load_series(engine: str) -> tuple[str, ...]:
    """The load series `status` reads of `engine` (contract/engines.py): running, waiting and, where the engine
    exports one, its KV cache gauge."""
    m = engines.metrics(engine)
    return tuple(name for name in (m.running, m.waiting, m.kv_usage) if name)


METRICS = load_series(engines.DEFAULT_ENGINE)  # vLLM's, the default engine's


def asked_on_host(s: Settings, group=None, name: str | None = None) -> bool:
    """Whether `status` asks this host's engine on the host over SSH: its API is out of the controller's
    reach (loopback only, no controller_api_url) and it runs one (a group's worker does not)."""
    return not api_reachable(s) and (group is None or group.head == name)


def api_headers(api_key: str | None) -> dict:
    """The headers an engine's API key asks for (none without a key): status and bench send the same."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


# What a failed request means, in words, by what the exception is and says (its chain's text, lower case): the first
# match wins. A library's own text never reaches a table (issue 51): it names its classes and its pools.
_TLS_WORDS = (("certificate has expired", "TLS: certificate expired"),
              ("hostname mismatch", "TLS: certificate names another host"),
              ("doesn't match", "TLS: certificate names another host"),
              ("certificate_verify_failed", "TLS: certificate not trusted"),
              ("wrong_version_number", "TLS: the port does not speak TLS"),
              ("record layer failure", "TLS: the port does not speak TLS"),
              ("certificate required", "TLS: the server wants a client certificate it was not given"),
              ("unknown ca", "TLS: the server does not trust the controller's certificate"),
              ("bad certificate", "TLS: the server refused the controller's certificate"))
_CONNECTION_WORDS = (("connection refused", "connection refused"), ("errno 111", "connection refused"),
                     ("name or service not known", "name not resolved"),
                     ("nodename nor servname", "name not resolved"), ("name resolution", "name not resolved"),
                     ("no route to host", "no route to host"), ("network is unreachable", "network unreachable"),
                     ("timed out", "timed out"), ("connection reset", "connection reset by the server"),
                     ("badstatusline", "answered, but not HTTP"), ("bad status line", "answered, but not HTTP"),
                     ("remotedisconnected", "closed the connection without an answer"),
                     ("without response", "closed the connection without an answer"),
                     ("connection aborted", "connection closed early"),
                     ("connection broken", "answer cut off (connection broken)"))


def _chain_text(exc: BaseException) -> str:
    """An exception's text with its causes' (urllib3 wraps the socket's error twice), lower case."""
    seen, parts, current = set(), [], exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(f"{type(current).__name__} {current}")
        current = current.__cause__ or current.__context__
    return " ".join(parts).lower()


def in_words(exc: BaseException) -> str:
    """What a failed request to a host means, in words for a person ("connection refused", "timed out", "TLS:
    certificate not trusted", ...): never the library's exception text."""
    import requests

    text = _chain_text(exc)
    if isinstance(exc, requests.exceptions.SSLError) or " ssl" in f" {text}" and "error" in text:
        found = next((words for needle, words in _TLS_WORDS if needle in text), None)
        if found or isinstance(exc, requests.exceptions.SSLError):
            return found or "TLS: handshake failed"
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return "timed out connecting"
    if isinstance(exc, requests.exceptions.Timeout):
        return "timed out waiting for an answer"
    found = next((words for needle, words in _CONNECTION_WORDS if needle in text), None)
    if found:
        return found
    if isinstance(exc, (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError)):
        return "answer cut off or garbled"
    if isinstance(exc, requests.exceptions.ConnectionError):
        return "could not connect"
    if isinstance(exc, requests.exceptions.InvalidURL):
        return "not a usable URL: check controller_api_url"
    if isinstance(exc, ValueError):
        return "answer is not the JSON expected"
    if isinstance(exc, (KeyError, TypeError, AttributeError)):
        return "answer of an unexpected shape"
    return "no usable answer"


def detail_words(detail: str) -> str:
    """A host helper's reason (sparkfleet-health on the host: "health: /health: URLError: <urlopen error [Errno
    111] Connection refused>") with the library's part in words ("health: /health: connection refused"); a reason
    with no exception in it stays as it is."""
    import re

    parts = detail.split(": ")
    at = next((i for i, part in enumerate(parts) if re.match(r"[A-Za-z_.]*(Error|Exception|timeout)\b|<urlopen", part)),
              None)
    if at is None:
        return detail
    text = ": ".join(parts[at:]).lower()
    found = next((words for needle, words in _TLS_WORDS if needle in text), None) if "ssl" in text else None
    found = found or next((words for needle, words in _CONNECTION_WORDS if needle in text), None)
    return ": ".join([*parts[:at], found or "no usable answer"])


class _ConnectNoise:
    """A logging filter for pyinfra's logger: its lines about connecting (a connect error, a known_hosts file it
    could not load) say what `status`'s table says in words ("unreachable over SSH")."""

    @staticmethod
    def filter(record) -> bool:
        path = record.pathname.replace("\\", "/")
        return not ("/pyinfra/connectors/" in path or (path.endswith("/pyinfra/api/host.py")
                                                       and record.funcName in ("connect", "disconnect")))


def quiet_connections() -> None:
    """No SSH library's log reaches the terminal for the rest of this process: paramiko's transport thread logs a
    traceback per failed banner (92 lines for a port that answers without an SSH banner), even after the command
    has printed its table; pyinfra's connect errors are said in the table. Other pyinfra warnings still show."""
    import logging

    paramiko = logging.getLogger("paramiko")
    if not any(isinstance(h, logging.NullHandler) for h in paramiko.handlers):
        paramiko.addHandler(logging.NullHandler())
    paramiko.propagate = False
    pyinfra = logging.getLogger("pyinfra")
    if not any(isinstance(f, _ConnectNoise) for f in pyinfra.filters):
        pyinfra.addFilter(_ConnectNoise())


def asked(url: str, probe: dict, served_name: str, headers: dict, session=None):
    """One probe of contract/serving.py over the host's API: (None, reply) when its answer counts, else (why,
    reply); judged by the host module's rule, as the helpers on the host judge it. `session`: the controller's
    client of the guards (fleet/tls.py `guard_client`), plain requests without one."""
    import requests

    reply = (session or requests).request(probe["method"], url + probe["path"], headers=headers,
                                          json=probes.probe_body(probe, served_name), timeout=probe["timeout_s"])
    try:
        body = reply.json()
    except ValueError:
        body = None
    return probes.answer_problem(probe, reply.status_code, body, served_name), body


def host_status(name: str, s: Settings, data: dict, chat: bool = False, on_host: dict | None = None,
                client=None) -> dict:
    """A host's engine asked as its watchdog asks it: health, the models listing, the chat probe. Over its API
    where the controller reaches it (through `client`, fleet/tls.py `guard_client`: https with the controller's
    fleet certificate where the guards serve TLS); else on the host (`on_host`: ssh_facts' "engine", None when
    the host did not answer over SSH)."""
    url = client.url(name, s, data) if client else api_url(name, s, data)
    session = client.session if client else requests
    row = {"host": name, "engine": s.engine, "url": url, "via": "http", "healthy": False,
           "served": None, "metrics": {}, "error": None}
    if row["url"] is None:
        return {**row, **on_host_status(on_host, chat)}
    headers = api_headers(s.api_key)
    step = serving.HEALTH["what"]  # what was being asked when a request failed: named in the row's error
    try:
        health, _ = asked(row["url"], serving.HEALTH, s.served_model_name, {}, session)
        step = serving.MODELS["what"]
        listing, models = asked(row["url"], serving.MODELS, s.served_model_name, headers, session)
        if isinstance(models, dict) and isinstance(models.get("data"), list):
            row["served"] = [m.get("id") for m in models["data"] if isinstance(m, dict)]
        step = "/metrics"
        metrics = read_metrics(session.get(f"{row['url']}/metrics", headers=headers, timeout=5).text)
        row["metrics"] = {name: value for name, value in metrics.items() if name in load_series(s.engine)}
        request = serving.REQUESTS["chat"]
        step = request["what"]
        answer = None if health or listing else asked(row["url"], request, s.served_model_name, headers,
                                                      session)[0]
        problems = [f"{probe['what']}: {why}" for probe, why in
                    ((serving.HEALTH, health), (serving.MODELS, listing), (request, answer)) if why]
        row["healthy"] = not problems
        row["error"] = "; ".join(problems) or None
        if chat and row["healthy"]:
            from openai import DefaultHttpxClient, OpenAI, OpenAIError

            step = "the chat (--chat)"

            # the chain is the fleet CA's; this client cannot be told the inventory name to check (fleet/tls.py)
            context = client.ssl_context(check_hostname=False) if client else None
            openai = OpenAI(base_url=f"{row['url']}/v1", api_key=s.api_key or "none", timeout=60,
                            **({"http_client": DefaultHttpxClient(verify=context, trust_env=False)} if context else {}))
            try:
                reply = openai.chat.completions.create(
                    model=s.served_model_name, max_tokens=24,
                    messages=[{"role": "user", "content": "Say hello from a DGX Spark."}],
                    extra_body={"chat_template_kwargs": {"enable_thinking": False}})
                row["chat"] = reply.choices[0].message.content
            except OpenAIError as exc:  # its status code where it has one; else what its cause means
                code = getattr(exc, "status_code", None)
                raise requests.ConnectionError(f"HTTP {code}" if code else "") from (exc.__cause__ or exc)
    except (requests.RequestException, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        row["healthy"] = False if step == "the chat (--chat)" else row["healthy"]
        row["error"] = f"{step}: {chat_words(exc) if step == 'the chat (--chat)' else in_words(exc)}"
    return row


def chat_words(exc: BaseException) -> str:
    """The chat's failure in words: its HTTP status where the server answered one, else `in_words`."""
    import re

    code = re.fullmatch(r"HTTP (\d{3})", str(exc))
    return f"answered HTTP {code[1]}" if code else in_words(exc)


def on_host_status(engine: dict | None, chat: bool) -> dict:
    """A row's health, served models, load and (`chat`) the chat probe's answer from the engine asked on the
    host (engine_on_host). What the host sent is checked, not trusted: a malformed report counts for nothing."""
    if engine is None:
        return {"via": "ssh"}
    report = engine.get("report") if isinstance(engine.get("report"), dict) else {}
    models = report.get("models")
    found = {"via": "ssh", "healthy": engine.get("serving") is True,
             "served": [str(m) for m in models] if isinstance(models, list) else None,
             "metrics": engine.get("metrics") or {},
             "error": None if engine.get("serving") is True else detail_words(str(engine.get("detail") or "no answer"))}
    if chat and found["healthy"] and isinstance(report.get("chat"), str):
        found["chat"] = report["chat"]
    return found


def engine_on_host(host, s: Settings) -> dict:
    """The engine asked on the host, as the converge asks a service (ServiceProbe: sparkfleet-health --once with
    the serving file's probes, the key read there from engine.env, never sent on a command line), and the
    load series of its /metrics."""
    from sparkfleet.host.serving import EngineMetrics
    from sparkfleet.host.services import ServiceProbe

    probe = host.get_fact(ServiceProbe, port=s.api_port, served_name=s.served_model_name, kind="chat",
                          container=s.container_name)
    names, engine = load_series(s.engine), engines.descriptor(s.engine)
    text = host.get_fact(EngineMetrics, port=paths.engine_port(s.api_port), names=names,
                         **({"key_var": engine.key_var} if engine.metrics_need_key and engine.key_var else {}))
    metrics = read_metrics(text or "")
    return {**probe, "metrics": {name: value for name, value in metrics.items() if name in names}}


def host_row(name: str, s: Settings, data: dict, facts: dict | None, chat: bool = False, client=None) -> dict:
    """One host's `status` row: its engine (host_status) and what it says over SSH (facts: None when it did not
    answer). Healthy: the engine serves the model, the unit is active, every RAG service answers and the
    watchdog has no problem for a person."""
    row = host_status(name, s, data, chat=chat, on_host=(facts or {}).get("engine"), client=client)
    row["ssh"] = facts
    row["healthy"] = row["healthy"] and facts is not None and facts["unit_active"] and all(
        svc["serving"] for svc in facts["services"].values())
    problem = ((facts or {}).get("watchdog") or {}).get("problem")
    if problem:  # the watchdog gave up, or the engine container lost the GPU: a person must look
        row["healthy"], row["error"] = False, problem + (f"; {row['error']}" if row["error"] else "")
    if facts is None:
        row["error"] = "unreachable over SSH" + (f"; {row['error']}" if row["error"] else "")
    elif row["via"] == "ssh" and "engine" not in facts:
        row["error"] = "API on loopback only, and its engine was not asked on the host"
    return row


def ray_problems(group, check) -> list[str]:
    """Why the head's Ray does not hold the whole group, one line each: fewer alive nodes than members, a
    member's fabric address missing, a node without its GPU. `check` is what the head's Ray check printed
    ({"alive_nodes": n, "gpus": [...], "addresses": [...]}, read back from a host: checked, not trusted)."""
    if not isinstance(check, dict):
        return [f"Ray check on {group.head} gave no answer"]
    alive, gpus, addresses = check.get("alive_nodes"), check.get("gpus"), check.get("addresses")
    if not (isinstance(alive, int) and isinstance(gpus, list) and isinstance(addresses, list)):
        return [f"Ray check on {group.head} gave an unreadable answer"]
    error = check.get("error")
    problems = [f"Ray on {group.head}: {error[:200]}"] if isinstance(error, str) and error else []
    missing = [f"{m} ({group.address_of(m)})" for m in group.members if group.address_of(m) not in addresses]
    if alive < group.size or missing:
        problems.append(f"Ray sees {min(alive, group.size)} of {group.size} nodes"
                        + (f": {', '.join(missing)} not in it" if missing else ""))
    # fewer GPU counts than addresses is a problem of its own (below): the ones both have are judged here
    without = [str(a) for a, g in zip(addresses, gpus, strict=False) if not (isinstance(g, (int, float)) and g >= 1)]
    if without or len(gpus) < len(addresses):
        problems.append(f"Ray nodes without a GPU: {', '.join(without) or 'some'}")
    return problems


def group_row(group, head_row: dict, facts: dict[str, dict | None]) -> dict:
    """A tensor-parallel group's one `status` row, named "spark-1+spark-2": the head's row (its API, its
    release) with every member listed by role. Healthy only when the head serves, every member's Ray unit
    is active and the head's Ray sees every member with its GPU; else `error` says why."""
    members = [{"host": m, "role": "head" if m == group.head else "worker", "address": group.address_of(m),
                "ssh": facts.get(m)} for m in group.members]
    problems = [f"{m['host']} unreachable over SSH" for m in members[1:] if m["ssh"] is None]
    problems += [f"{paths.RAY_UNIT_NAME} inactive on {m['host']}" for m in members
                 if m["ssh"] is not None and not m["ssh"].get("ray_active")]
    head = facts.get(group.head)
    if head is not None:
        problems += ray_problems(group, head.get("ray"))
    reached = [m["ssh"] for m in members if m["ssh"] is not None]
    ssh = None if head is None else {
        **head, "unit_active": head["unit_active"] and len(reached) == len(members)
        and all(f.get("ray_active") for f in reached),
        "model_verified": None if len(reached) < len(members) else all(f["model_verified"] for f in reached)}
    error = "; ".join(problems + ([f"{group.head}: {head_row['error']}"] if head_row.get("error") else []))
    return {**head_row, "host": group.name, "group": group.name, "members": members, "ssh": ssh,
            "healthy": head_row["healthy"] and not problems, "error": error or None}


def fleet_rows(hosts: list[str], groups: dict, facts: dict[str, dict | None], row_of) -> list[dict]:
    """`status`'s rows in inventory order: a single host's own (row_of(name) -> host_row), and one row per
    group where its first member appears, from its head's row (a worker serves no API of its own).
    `groups` maps each member to its TensorParallelGroup; `hosts` holds every member of each group;
    `facts` is each host's ssh_facts (None: it did not answer)."""
    rows, seen = [], set()
    for name in hosts:
        group = groups.get(name)
        if group is None:
            rows.append(row_of(name))
        elif group.name not in seen:
            seen.add(group.name)
            rows.append(group_row(group, row_of(group.head), facts))
    return rows


def host_cell(row: dict) -> str:
    """The `status` table's host column: a host's name; a group's name with each member's role."""
    if not row.get("members"):
        return row["host"]
    roles = ", ".join(f"{m['role']} {m['host']}" for m in row["members"])
    return f"{row['host']} ({roles})"


def ssh_facts(host, group=None, settings: Settings | None = None) -> dict:
    """What the host itself says: driver, CUDA, toolkit, release, verified model, unit state; a group
    member's Ray unit state too, and on a group's head what its Ray sees (the head's Ray check); with its
    `settings`, an engine the controller cannot reach asked on the host ("engine": engine_on_host)."""
    from pyinfra.facts.deb import DebPackage
    from pyinfra.facts.systemd import SystemdStatus

    from sparkfleet.roles.pki import ends
    from sparkfleet.host.facts import JsonFile, ModelFiles, NvidiaSmi, read_json_object
    from sparkfleet.host.serving import ServingProbe, watchdog_summary
    from sparkfleet.contract import quality
    from sparkfleet.contract.shared import verify

    gpu = host.get_fact(NvidiaSmi)
    release = read_json_object(host, paths.RELEASE_FILE).value or {}
    toolkit = host.get_fact(DebPackage, package="nvidia-container-toolkit") or {}
    verified = None
    if release.get("model_dir"):
        state = host.get_fact(ModelFiles, model_dir=release["model_dir"], record=paths.VERIFIED_RECORD)
        record, files = state["record"], state["files"]
        expected = (release.get("manifest") or {}).get("files")
        vouched = all(verify.vouches(entry, files.get(path)) for path, entry in record.items())
        exact = not verify.extras(record, files, state.get("others", {}))
        verified = bool(record) and len(record) == expected and vouched and exact
    units = host.get_fact(SystemdStatus, services=[paths.UNIT_NAME, paths.RAY_UNIT_NAME]) or {}
    facts = {"driver": gpu.driver, "cuda": gpu.cuda, "toolkit": toolkit.get("version"),
             "release_id": release.get("release_id"), "model_verified": verified,
             "unit_active": bool(units.get(paths.UNIT_NAME)),
             "watchdog": watchdog_summary(host.get_fact(ServingProbe)), "services": services_status(host, release),
             "certificate_ends": ends(host.get_fact(JsonFile, path=paths.TLS_HOST_CERT)),  # the fleet's TLS
             "last_eval": quality.summary(read_json_object(host, paths.QUALITY_FILE).value, release.get("release_id"))}
    if group:
        facts["ray_active"] = bool(units.get(paths.RAY_UNIT_NAME))
    if group and group.head == host.name:
        facts["ray"] = ray_check(host, group)
    if settings is not None and asked_on_host(settings, group, host.name):
        facts["engine"] = engine_on_host(host, settings)
    return facts


def ray_check(host, group) -> dict | None:
    """What the head's Ray sees (sparkfleet-ray-check asks its Ray container, no waiting): the helper's JSON
    line, or None when it printed none. The helper exits 1 when a member is missing: its line still counts."""
    import json

    from pyinfra.api import StringCommand

    from sparkfleet.host.facts import ray_check_args
    from sparkfleet.host.run import as_the_host_runs

    args = ray_check_args(group.ray_address, group.address_of(host.name),
                          dict(zip(group.members, group.addresses, strict=True)))
    _, output = as_the_host_runs(host, StringCommand("python3", paths.RAY_CHECK, *args, "2>/dev/null || true"))
    try:
        return json.loads(output.stdout_lines[-1]) if output.stdout_lines else None
    except ValueError:
        return None


def services_status(host, release: dict) -> dict:
    """Each RAG service of the installed release, asked on the host (its port may listen on loopback only):
    {name: {kind, port, serving, detail}}. A record entry of the wrong shape counts as not serving."""
    from sparkfleet.host.services import ServiceProbe

    found = {}
    for name, svc in sorted((release.get("services") or {}).items()):
        row = {"kind": svc.get("kind"), "port": svc.get("api_port"), "share": svc.get("gpu_memory_utilization")}
        if isinstance(svc.get("on_demand"), dict):
            row.update(on_demand_status(host, name, svc))
            if row["state"] != "running":  # idle-stopped, starting or broken: asking it would start it
                found[name] = row
                continue
        try:
            probe = host.get_fact(ServiceProbe, port=int(svc["api_port"]), served_name=str(svc["served_model_name"]),
                                  kind=str(svc["kind"]), container=str(svc["container"]))
        except (KeyError, TypeError, ValueError):
            probe = {"serving": False, "detail": "unreadable entry in the release record"}
        found[name] = {**row, **probe}
    return found


def on_demand_status(host, name: str, svc: dict) -> dict:
    """An on-demand model's state from its units: idle-stopped (its socket listens; not a problem), starting,
    running (then probed like any service), or a problem (its socket down, its last start failed); and the seconds
    since its last request (the guard's stats)."""
    from sparkfleet.host.services import OnDemandState

    found = host.get_fact(OnDemandState, unit=paths.service_unit(name), socket=paths.on_demand_socket(name))
    last = found["last"].get(f"service_{name}")
    row = {"on_demand": True, "last_request_s": last if isinstance(last, (int, float)) else None}
    if found["socket"] != "active":
        return {**row, "state": "down", "serving": False,
                "detail": f"its socket {paths.on_demand_socket(name)} is {found['socket']}: converge the host"}
    if found["engine"] == "failed":
        return {**row, "state": "failed", "serving": False,
                "detail": f"its last start failed: journalctl -u {paths.service_unit(name)}"}
    state = {"active": "running", "activating": "starting"}.get(found["engine"], "idle-stopped")
    return {**row, "state": state, "serving": True, "detail": ""}


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "none since the guard started"
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def services_cell(services: dict) -> str:
    """The `status` table's services column: each service, its port, and whether it answers."""
    def cell(name: str, svc: dict) -> str:
        head = literal(f"{name}:{svc['port']} ")
        if not svc["serving"]:
            return head + f"[red]NOT answering[/] ({literal(str(svc['detail'])[:80])})"
        if not svc.get("on_demand"):
            return head + "answers"
        state = "answers" if svc["state"] == "running" else svc["state"]
        return head + f"{state} (on demand, share {svc.get('share')}, last request {ago(svc['last_request_s'])})"
    return ", ".join(cell(name, svc) for name, svc in services.items()) or "-"


WIDE_COLUMNS = ("host", "engine", "driver", "CUDA", "toolkit", "release", "model", "unit", "health", "watchdog",
                "served", "services", "last eval", "run", "wait", "KV", "detail")
NARROW_COLUMNS = ("host", "engine", "release", "health", "served", "detail")


def health_cell(row: dict) -> str:
    if row["ssh"] is None:
        return "[red]unreachable[/]"
    return "[green]healthy[/]" if row["healthy"] else "[red]unhealthy[/]"


def metric_cell(metrics: dict, name: str, form: str) -> str:
    """A load series' value; "-" when the engine did not report it (or was not reached)."""
    return format(metrics[name], form) if name in metrics else "-"


def hidden_problems(row: dict) -> list[str]:
    """What the wide table's unit, model and services columns would show in red, for the narrow table's detail."""
    f = row["ssh"]
    if f is None:
        return []
    problems = [] if f.get("unit_active") else ["engine unit inactive"]
    if ending_soon(f.get("certificate_ends")):  # the converge re-issues it 30 days before its end: it did not run
        problems.append(f"TLS certificate ends {f['certificate_ends']}: converge the host")
    if f.get("model_verified") is False:
        problems.append("model NOT verified")
    problems += [f"service {name} NOT answering ({str(svc['detail'])[:80]})"
                 for name, svc in (f.get("services") or {}).items() if not svc["serving"]]
    problems += [f"eval: {model} below its baseline ({', '.join(m['below'])})"
                 for model, m in ((f.get("last_eval") or {}).get("models") or {}).items() if m["below"]]
    return problems


def eval_cell(last: dict | None) -> str:
    """The `status` table's last eval column (contract/quality.py `summary`): when, and each model's score and the
    probes it failed, in red where it fell below its release's baseline; "-" without one."""
    if not last:
        return "-"
    def model(name: str, m: dict) -> str:
        score = "not evaluated" if m["score"] is None else f"{m['score']:.2f}"
        failed = f", failed {', '.join(m['failed'])}" if m["failed"] else ""
        text = literal(f"{name} {score}{failed}")
        return f"[red]{text} (below baseline)[/]" if m["below"] else text
    return literal(last["at"] or "?") + ": " + "; ".join(model(n, m) for n, m in last["models"].items())


def ending_soon(day: str | None, now: float | None = None) -> bool:
    """A certificate's end (`pki.ends`) within the alert's 14 days (TlsCertificateExpiring)."""
    import datetime as dt

    if not day:
        return False
    end = dt.datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=dt.timezone.utc).timestamp()
    return end - (time.time() if now is None else now) < 14 * 86400


def status_table(rows: list[dict], wide: bool) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """`status`'s (columns, cells): every column on a wide console; host, release, health, served and detail
    on a narrow one (a terminal under CI_WIDTH, a log), the detail then naming what the dropped columns would have
    shown in red. A host that did
    not answer over SSH shows "-" for all it did not say."""
    from sparkfleet.host.serving import watchdog_cell

    cells = []
    for row in rows:
        f, m = row["ssh"] or {}, row["metrics"] or {}
        engine = row.get("engine") or engines.DEFAULT_ENGINE
        series = engines.metrics(engine)
        release = literal(f.get("release_id") or "-")
        served = literal(", ".join(map(str, row["served"] or [])) or "-")
        if not wide:
            detail = "; ".join(([row["error"]] if row["error"] else []) + hidden_problems(row))
            gave_up = "[red]GAVE UP[/]: " if (f.get("watchdog") or {}).get("gave_up") else ""  # the wide one's red
            cells.append((literal(host_cell(row)), engine, release, health_cell(row), served,
                          gave_up + literal(detail)))
            continue
        unit = "-" if row["ssh"] is None else "active" if f.get("unit_active") else "[red]inactive[/]"
        cells.append((
            literal(host_cell(row)), engine, *(literal(f.get(key) or "-") for key in ("driver", "cuda", "toolkit")),
            release,
            {True: "verified", False: "[red]NOT verified[/]"}.get(f.get("model_verified"), "-"), unit,
            health_cell(row), watchdog_cell(f.get("watchdog")), served, services_cell(f.get("services") or {}),
            eval_cell(f.get("last_eval")),
            metric_cell(m, series.running, "g"), metric_cell(m, series.waiting, "g"),
            metric_cell(m, series.kv_usage, ".0%") if series.kv_usage else "n/a", literal(row["error"] or ""),
        ))
    return (WIDE_COLUMNS if wide else NARROW_COLUMNS), cells


BACKUP_COLUMNS = ("source", "host", "last good backup", "snapshot", "state")


def backup_rows(rows: list[dict]) -> list[tuple[str, ...]]:
    """`status`'s backups (fleet/backup.py `backup_status`): each source's last good backup, its age and its state,
    in red where the last run failed or the last good one is overdue (the alert's rule), with why."""
    from sparkfleet.fleet.backup import age_words

    colour = {"ok": "green", "failed": "red", "overdue": "red", "none": "yellow", "unknown": "yellow"}
    cells = []
    for row in rows:
        age = "-" if row["age_s"] is None else age_words(row["age_s"])
        state = f"[{colour.get(row['state'], 'red')}]{literal(row['state'])}[/]"
        cells.append((literal(row["source"]), literal(row["host"]), age, literal(row["snapshot"] or "-"),
                      state + (f": {literal(row['error'])}" if row["error"] else "")))
    return cells

"""Schemathesis hooks of the OpenAPI conformance test (test/integration/conformance.test.ts).

They supply test data, never relax a check: in cases Schemathesis generated as valid (positive mode) they put
real ids where a field must name something that exists (a user, an enrolled machine, a site) and keep the
rules JSON Schema cannot state across fields (a mount's `to` differs from `from`; a version body's chunk sizes
match its files), each stated in the operation's description in /api/openapi.json. Negative cases are left as
generated. Every keyed request gets its own Idempotency-Key: deterministic generation repeats values, and a
key reused with another body is the documented 422 idempotency_key_mismatch, not a defect.

The ids come from the test's environment: ROOST_CONF_USER, ROOST_CONF_SITE, ROOST_CONF_MACHINE.
"""

import os
import uuid

import schemathesis
from schemathesis.core.parameters import ParameterLocation

USER = os.environ.get("ROOST_CONF_USER", "")
SITE = os.environ.get("ROOST_CONF_SITE", "")
MACHINE = os.environ.get("ROOST_CONF_MACHINE", "")
IDEMPOTENCY_MAX_LENGTH = 255
VERSION_BODY = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.svc.version.v1+json",
    "config": {},
    "files": [{"path": "conformance.txt", "size": 0, "chunks": []}],
}


def _positive(case, location):
    meta = getattr(case, "_meta", None)
    return meta is None or not meta.is_negative_at(location)


def _seconds(hhmm):
    """Seconds of day of 'HH:MM[:SS]', or None."""
    if not isinstance(hhmm, str):
        return None
    parts = hhmm.split(":")
    try:
        return int(parts[0]) * 3600 + int(parts[1]) * 60 + (int(parts[2]) if len(parts) > 2 else 0)
    except (ValueError, IndexError):
        return None


def _map_body(op, body):
    if op in ("POST /api/sites", "PATCH /api/sites/{siteId}") and isinstance(body.get("ownerUid"), str):
        body["ownerUid"] = USER
    elif op in ("POST /api/chat", "POST /api/cortex/conversations") and isinstance(body.get("machineId"), str):
        # A conversation narrowed to a machine needs it enrolled and online (else 400/503 cortex_unavailable): site-wide.
        body.pop("machineId")
    elif op == "POST /api/sites/{siteId}/deployments" and isinstance(body.get("machines"), list):
        body["machines"] = [MACHINE]
    elif op.startswith(("POST /api/sites/{siteId}/machines/{machineId}/processes", "PATCH /api/sites/{siteId}/machines/{machineId}/processes")):
        # A schedule block's end differs from its start (an earlier end spans midnight).
        for block in body.get("schedules") or []:
            if isinstance(block, dict) and block.get("start") is not None and block.get("start") == block.get("end"):
                block["end"] = "23:59" if block["start"] != "23:59" else "00:00"
    elif op in ("POST /api/users/{uid}/assign-sites", "POST /api/users/{uid}/remove-sites") and isinstance(body.get("siteIds"), list):
        body["siteIds"] = [SITE]
    elif op == "POST /api/chunks/{digest}/mount" and body.get("from") is not None and body.get("from") == body.get("to"):
        src = body["from"]
        body["to"] = src + "-" if len(src) < 64 else src[:-1] + ("a" if src[-1] != "a" else "b")
    elif op == "POST /api/roosts/{roostId}/deploy" and isinstance(body.get("policy"), dict):
        # The policy's cross-field rules (POLICY_SCHEMA's descriptions): waves strictly increasing (the
        # document already requires 100 among them, so it ends the list); a window's end differs from its start.
        policy = body["policy"]
        if isinstance(policy.get("waves"), list) and all(isinstance(w, (int, float)) for w in policy["waves"]):
            policy["waves"] = sorted(set(policy["waves"]))
        window = policy.get("maintenanceWindow")
        if isinstance(window, dict) and window.get("start") is not None and _seconds(window.get("start")) == _seconds(window.get("end")):
            window["end"] = "23:59" if _seconds(window["start"]) != 23 * 3600 + 59 * 60 else "00:00"
    elif op == "POST /api/roosts/{roostId}/versions" and "version" in body:
        body["version"] = dict(VERSION_BODY)
    return body


@schemathesis.hook
def map_case(context, case):
    op = f"{case.method.upper()} {case.path}"
    headers = case.headers
    if headers is not None and _positive(case, ParameterLocation.HEADER):
        key = headers.get("Idempotency-Key")
        if isinstance(key, str) and 1 <= len(key) <= IDEMPOTENCY_MAX_LENGTH:
            headers["Idempotency-Key"] = f"conformance-{uuid.uuid4().hex}"
    if isinstance(case.body, dict) and _positive(case, ParameterLocation.BODY):
        case.body = _map_body(op, case.body)
        if op == "POST /api/sites/{siteId}/deployments" and _positive(case, ParameterLocation.PATH):
            case.path_parameters["siteId"] = SITE  # the site the machine is enrolled in
    if op == "DELETE /api/users/{uid}" and isinstance(case.query, dict) and _positive(case, ParameterLocation.QUERY):
        # successorUid must name another active admin; the case without one is the valid form to try here.
        case.query.pop("successorUid", None)
    return case

#!/usr/bin/python3
"""Renders chat templates with Python jinja2 set up as transformers does, for Anchorage's parity tests.

Reads {"cases": [...]} as JSON on stdin; each case has "id", "template" and either "context" (the
template's variables) or "body" (an OpenAI chat body rendered as apply_chat_template does, with
optional "bos_token"/"eos_token"; tool-call arguments given as JSON text are parsed first, as
Anchorage, vLLM and SGLang do). Writes a JSON list of {"id", "ok", "output" | "error"}.
Exit status 3 means python3-jinja2 is missing (Debian: apt-get install python3-jinja2).
"""
import json
import sys
from datetime import datetime

try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:  # the test reports this as a setup failure
    sys.stderr.write("render_reference.py: python3-jinja2 is not installed (%s); "
                     "install it with: apt-get install python3-jinja2\n" % e)
    sys.exit(3)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def parse_tool_call_arguments(messages):
    """Parses tool-call arguments given as JSON text of an object, as vLLM and SGLang do for OpenAI bodies."""
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("tool_calls"), list):
            continue
        for call in message["tool_calls"]:
            if not isinstance(call, dict):
                continue
            holder = call["function"] if isinstance(call.get("function"), dict) else call
            if isinstance(holder.get("arguments"), str):
                try:
                    parsed = json.loads(holder["arguments"])
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    holder["arguments"] = parsed


def body_context(case):
    body = case["body"]
    parse_tool_call_arguments(body["messages"])
    context = {
        "messages": body["messages"],
        "tools": body.get("tools"),
        "documents": None,
        "add_generation_prompt": True,
    }
    for key in ("bos_token", "eos_token"):
        if case.get(key):
            context[key] = case[key]
    context.update(body.get("chat_template_kwargs") or {})
    return context


def main():
    request = json.load(sys.stdin)
    env = make_env()
    compiled = {}
    results = []
    for case in request["cases"]:
        result = {"id": case.get("id", "")}
        try:
            source = case["template"]
            if source not in compiled:
                compiled[source] = env.from_string(source)
            context = body_context(case) if "body" in case else case.get("context", {})
            result["output"] = compiled[source].render(**context)
            result["ok"] = True
        except Exception as e:  # every failure is data for the parity test
            result["ok"] = False
            result["error"] = "%s: %s" % (type(e).__name__, e)
        results.append(result)
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()

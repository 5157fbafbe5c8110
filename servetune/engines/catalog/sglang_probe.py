"""Ask an installed SGLang about its own launch flags. Runs under SGLang's Python, stdlib only.

Why: a flag catalogue copied by hand drifts; this reads ``ServerArgs.add_cli_args`` itself.
``dump`` prints the catalogue as JSON (servetune turns it into ``sglang-<version>.yaml``);
``check ARGS...`` parses a launch argv with SGLang's own parser (exit 0, or exit 2 and the
parser's message), touching no GPU and no model, and prints the same catalogue beside the verdict
so the runner's exact flag set is cached for that version. servetune sends this file's text as
``python -c`` so it also works on a runner where servetune is not installed.
"""

import argparse
import json
import sys


def _parser():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    return parser


def _version():
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # an editable or vendored install
        import sglang

        return getattr(sglang, "__version__", "unknown")


def _kind(action):
    name = type(action).__name__
    if name.endswith("StoreTrueAction") or name.endswith("StoreFalseAction"):
        return "bool"
    if name == "BooleanOptionalAction":
        return "bool_optional"
    if name.endswith("StoreConstAction"):
        return "const"
    if action.choices is not None:
        return "choice"
    if action.nargs not in (None, "?"):
        return "list"
    typ = getattr(action.type, "__name__", None)
    if typ in ("int", "float"):
        return typ
    if typ in ("loads", "json_list_type"):
        return "json"
    return "str"


def _plain(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return str(value)


def _catalog(parser):
    flags = {}
    for action in parser._actions:
        longs = [s for s in action.option_strings if s.startswith("--")]
        if not longs or action.dest == "help":
            continue
        kind = _kind(action)
        entry = {"type": kind, "dest": action.dest}
        if len(longs) > 1:
            entry["aliases"] = [s[2:] for s in longs[1:]]
        if kind == "choice":
            entry["choices"] = [_plain(c) for c in action.choices]
        if kind == "list":
            entry["nargs"] = action.nargs
            elem = getattr(action.type, "__name__", "str")
            entry["item_type"] = elem if elem in ("int", "float") else "str"
        if kind == "str" and action.type is not None and getattr(action.type, "__name__", "str") != "str":
            entry["parser"] = getattr(action.type, "__name__", str(action.type))
        if action.required:
            entry["required"] = True
        if kind not in ("bool", "const"):
            entry["default"] = _plain(action.default)
        new_flag = getattr(action, "new_flag", None)
        if type(action).__name__.startswith("Deprecated") or new_flag:
            entry["deprecated"] = True
            if new_flag:
                entry["replacement"] = str(new_flag).lstrip("-")
        help_text = " ".join((action.help or "").split())
        if help_text and help_text != "==SUPPRESS==":
            entry["help"] = help_text[:200]
        flags[longs[0][2:]] = entry
    return {"engine": "sglang", "version": _version(), "allow_abbrev": parser.allow_abbrev, "flags": flags}


def dump():
    json.dump(_catalog(_parser()), sys.stdout, indent=1, sort_keys=True)


def check(argv):
    parser = _parser()
    messages = []

    def _error(message):
        messages.append(message)
        raise SystemExit(2)

    parser.error = _error
    parser.exit_on_error = False
    catalog = _catalog(parser)
    try:
        parser.parse_args(argv)
    except SystemExit:
        print(json.dumps({"ok": False, "version": _version(), "error": messages[0] if messages else "exit",
                          "catalog": catalog}))
        return 2
    print(json.dumps({"ok": True, "version": _version(), "catalog": catalog}))
    return 0


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "dump"
    if mode == "dump":
        dump()
    elif mode == "check":
        sys.exit(check(sys.argv[2:]))
    else:
        sys.exit("usage: sglang_probe.py dump | check ARGS...")

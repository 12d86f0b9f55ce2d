"""The ``pdscale`` command: one subcommand per job, each in its own module, imported lazily
so that ``pdscale render`` does not pay for scipy and ``pdscale replay`` not for kopf."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module under pdscale that defines add_arguments(parser) and run(args) -> int
SUBCOMMANDS = {
    "cluster": ("pdscale.localcluster", "start, stop or inspect the local control plane"),
    "render": ("pdscale.render", "print the manifests the operator would create for a PDCluster"),
    "replay": ("pdscale.replay", "replay a trace through the planner on a simulated fleet"),
    "demo": ("pdscale.demo", "the whole loop here: cluster, operator, router, simulated fleet, phased load"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pdscale", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {}
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # a subcommand whose extras are missing must not hide the others
            sub.add_parser(name, help=f"(unavailable: {exc})")
            continue
        modules[name] = module
        module.add_arguments(sub.add_parser(name, help=help_text, description=module.__doc__))
    args = parser.parse_args(argv)
    if args.command not in modules:
        parser.error(f"subcommand {args.command!r} is unavailable in this installation")
    return int(modules[args.command].run(args))


if __name__ == "__main__":
    sys.exit(main())

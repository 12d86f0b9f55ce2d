"""The ``pdscale`` command: one subcommand per job, each in its own module, imported lazily
so that ``pdscale render`` does not pay for scipy and ``pdscale replay`` not for kopf.

The product's own subcommands are listed here. Others (``demo``, ``cluster``) come from the
test bed, installed with the ``testbed`` extra, through the ``pdscale.commands`` entry-point
group: the command line never imports the test bed, it only finds what is installed."""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points

# subcommand -> (module that defines add_arguments(parser) and run(args) -> int, help)
SUBCOMMANDS = {
    "render": ("pdscale.render", "print the manifests the operator would create for a PDCluster"),
    "replay": ("pdscale.replay", "replay a trace through the planner on a simulated fleet"),
    "replay-pool": ("pdscale.replay_pool", "replay several PDClusters, one trace each, on one shared pool of nodes"),
    "profile": ("pdscale.profile_cmd", "fit a profile to benchmark results, measure one with aiperf, or export the one a PDCluster uses"),
}
PLUGIN_GROUP = "pdscale.commands"


def subcommands() -> dict[str, tuple[str, str]]:
    """The product's subcommands, then those installed extras add (a plugin cannot replace one
    of ours). An entry point's value is the module; the module's ``HELP`` is the help line."""
    found = dict(SUBCOMMANDS)
    for ep in entry_points(group=PLUGIN_GROUP):
        found.setdefault(ep.name, (ep.value, ""))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pdscale", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {}
    for name, (module_name, help_text) in subcommands().items():
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # a subcommand whose extras are missing must not hide the others
            sub.add_parser(name, help=f"(unavailable: {exc})")
            continue
        modules[name] = module
        module.add_arguments(sub.add_parser(name, help=help_text or getattr(module, "HELP", ""),
                                            description=module.__doc__))
    args = parser.parse_args(argv)
    if args.command not in modules:
        parser.error(f"subcommand {args.command!r} is unavailable in this installation")
    return int(modules[args.command].run(args))


if __name__ == "__main__":
    sys.exit(main())

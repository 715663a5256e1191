# PYTHON_ARGCOMPLETE_OK  (argcomplete's marker: this command completes in bash and zsh)
"""The ``irdma`` command: run a local cluster, move tensors, inspect and benchmark.

examples:
  irdma local --nodes 3 --dir /tmp/irdma      a local cluster (--background for scripts)
  export IRDMA_CONFIG=/tmp/irdma/cluster.toml
  irdma put resnet/fc.weight w.npy            one array; .npz/.safetensors: each under NAME/
  irdma get resnet -o resnet.safetensors      .npy, .npz, .safetensors, DIR/ or - (stdout)
  irdma ls -lh 'resnet/*'                     names, patterns (* ? [] **) or prefixes
  irdma versions policy; irdma get policy@3   a model's committed versions; one of them
  irdma cp -r resnet backup/resnet; irdma rm -r backup
  irdma status                                every daemon; exit 1 if any is down
  irdma drain n3                              move n3's shards off it (membership in etcd)
  irdma doctor                                what breaks RDMA, FUSE, memlock here
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

import trio

from .. import __version__, mounts
from ..client import AsyncClient
from ..cluster import load_config, parse_size
from . import bench as benchmod
from . import doctor as doctormod
from . import drain as drainmod
from . import local as localmod
from . import status as statusmod
from . import versioncmds as versionmod
from .boundary import guarded
from .tensorcmds import COMMANDS as TENSOR_COMMANDS
from .tensorcmds import put_argument_problem

# How long `irdma status` waits for each daemon unless --timeout says: a paused
# daemon is reported as down in the time `irdma doctor` gives it, not after
# the whole client timeout.
STATUS_TIMEOUT = doctormod.DEFAULT_TIMEOUT


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the descriptions' line breaks; adds "(default: X)" to options that have one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or "(default" in text  # it says the default in its own words (16GiB, not bytes)
            or not action.option_strings
            or default is None
            or default is False
            or default == []
            or default is argparse.SUPPRESS
        ):
            return text
        return f"{text} (default: %(default)s)"


async def cmd_status(client: AsyncClient, args: argparse.Namespace) -> int:
    """One row per daemon (``irdma.cli.status``), then this host's mounts; exit 1 if any is down."""
    rows = await statusmod.gather(client)
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
    else:
        recorded = await statusmod.recorded_versions(client.config)
        models = statusmod.model_status(rows, recorded)
        print(statusmod.render(rows, client.config, models))
        for rec in mounts.live_mounts(client.config.path):
            print(rec.line())
    return 0 if all(r.up for r in rows) else 1


async def cmd_bench(client: AsyncClient, args: argparse.Namespace) -> int:
    result = await benchmod.run(
        client, size=parse_size(args.size), repeat=args.repeat, latency_iters=args.latency_iters
    )
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(benchmod.format_table(result))
    return 0


CLIENT_COMMANDS: dict[str, Callable] = {
    **TENSOR_COMMANDS,
    "get": versionmod.cmd_get,  # NAME@V, else the tensor command
    "versions": versionmod.cmd_versions,
    "status": cmd_status,
    "bench": cmd_bench,
}


class PutItems(argparse.Action):
    """put's NAME FILE list, checked while parsing so a mix-up is a usage error (exit 2)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        problem = put_argument_problem(values)
        if problem:
            parser.error(problem)
        setattr(namespace, self.dest, values)


def add_global_options(p: argparse.ArgumentParser, *, in_subcommand: bool) -> None:
    """--config and --timeout, accepted before the subcommand and after it.

    In a subcommand their default is SUPPRESS, so a value given before the
    subcommand is not overwritten by the subcommand's default.
    """
    default = argparse.SUPPRESS if in_subcommand else None
    for flags, kwargs in (
        (
            ("--config",),
            {
                "metavar": "FILE",
                "help": "cluster config (default: $IRDMA_CONFIG, then /etc/irdma/cluster.toml)",
            },
        ),
        (
            ("--timeout",),
            {
                "type": float,
                "metavar": "SECONDS",
                "help": "seconds to wait for a daemon's answer (default: the config's "
                "timeout; 2 for status and doctor)",
            },
        ),
    ):
        with contextlib.suppress(argparse.ArgumentError):  # a subcommand defines its own
            p.add_argument(*flags, default=default, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="irdma",
        description="irdma parameter server: tensors on psd daemons.",
        formatter_class=HelpFormatter,
        epilog=__doc__.split("\n", 2)[2],
    )
    p.add_argument("--version", action="version", version=f"irdma {__version__}")
    add_global_options(p, in_subcommand=False)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str, **kwargs) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=summary,
            description=description,
            formatter_class=HelpFormatter,
            **kwargs,
        )

    localmod.add_arguments(
        command(
            "local",
            "run N daemons on loopback (foreground, or --background)",
            localmod.DESCRIPTION,
        )
    )

    s = command(
        "put",
        "store arrays from .npy/.npz/.safetensors files, a directory or stdin",
        "Store the arrays in FILE as tensor NAME. A .npy (or - for a .npy on stdin) is one "
        "tensor;\nevery array of a .npz or .safetensors, and every .npy under a directory, "
        "is stored\nunder NAME/. Several NAME FILE pairs may follow each other. A NAME "
        "ending in .npy is\nstored without it (the mount shows tensor m/w as m/w.npy).",
    )
    s.add_argument(
        "items",
        nargs="+",
        metavar="NAME FILE",
        action=PutItems,
        help="tensor name (or prefix), then its file",
    )
    s.add_argument(
        "--replace", action="store_true", help="redefine tensors that have another dtype or shape"
    )

    s = command(
        "get",
        "fetch tensors into a file, a directory or stdout",
        "Fetch tensor NAME, every tensor under NAME/, or every tensor a pattern matches;\n"
        "NAME@V: version V (or latest) of model NAME, or that tensor of the model above it.\n"
        "The output's type comes from -o: FILE.npy (one tensor), FILE.npz or "
        "FILE.safetensors\n(named by their path below NAME/), DIR/ (one .npy per tensor) or "
        "- (one .npy on stdout).\nWithout -o: into the current directory, named after NAME's "
        "last part (fc.weight.npy;\nresnet.npz for a group), never over an existing file; "
        "the path is printed.",
    )
    s.add_argument("name", metavar="NAME", help="a tensor, a group (prefix) or a pattern")
    s.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="FILE.npy, .npz, .safetensors, DIR/ or - (default: ./LAST.npy, or ./LAST.npz "
        "for several tensors)",
    )

    s = command(
        "versions",
        "list a model's committed versions",
        "The versions of model MODEL (the tensors under it committed together) that are\n"
        "kept: number, when committed, tensors, size, writers. Fetch one with get MODEL@V.",
    )
    versionmod.add_arguments(s)

    s = command(
        "cp",
        "copy tensors to new names",
        "Copy tensor SRC to DEST (DEST/ keeps the name's last part), or with -r every tensor\n"
        "under SRC/ to the same names under DEST/. A pattern copies its matches under DEST/.",
    )
    s.add_argument("source", metavar="SRC", help="a tensor, a group with -r, or a pattern")
    s.add_argument("dest", metavar="DEST", help="the new name, or a group ending in /")
    s.add_argument("-r", "--recursive", action="store_true", help="copy every tensor under SRC/")
    s.add_argument(
        "--replace", action="store_true", help="redefine targets that have another dtype or shape"
    )

    s = command(
        "mv",
        "rename tensors",
        "Rename tensor SRC to DEST (DEST/ keeps the name's last part), or with -r every\n"
        "tensor under SRC/ to the same names under DEST/. A pattern moves its matches under\n"
        "DEST/. The daemons rename in place: no bytes are copied.",
    )
    s.add_argument("source", metavar="SRC", help="a tensor, a group with -r, or a pattern")
    s.add_argument("dest", metavar="DEST", help="the new name, or a group ending in /")
    s.add_argument("-r", "--recursive", action="store_true", help="move every tensor under SRC/")
    s.add_argument("--replace", action="store_true", help="replace targets that exist")

    # -h is "human-readable sizes" here, as in ls(1); --help still prints help.
    s = command(
        "ls",
        "list tensors",
        "List tensors whose names start with PREFIX, or match PATTERN (* and ? within one\n"
        "part of the name, ** across parts, [...] a class). Directory markers left by mkdir\n"
        "in the mount are hidden (-a shows them).",
        add_help=False,
    )
    s.add_argument("--help", action="help", help="show this help message and exit")
    s.add_argument("patterns", nargs="*", metavar="PREFIX|PATTERN", help="what to list (all)")
    s.add_argument("-l", "--long", action="store_true", help="dtype, shape, bytes, version")
    s.add_argument("-h", "--human", action="store_true", help="with -l: sizes in KiB, MiB, GiB")
    s.add_argument("-a", "--all", action="store_true", help="show directory markers too")
    s.add_argument("--json", action="store_true", help="one JSON record per tensor")

    s = command("stat", "show tensors' metadata", "Show the metadata of each tensor NAME.")
    s.add_argument("names", nargs="+", metavar="NAME", help="tensor names")
    s.add_argument(
        "--json", action="store_true", help="JSON (a record for one name, a list for several)"
    )

    s = command(
        "rm",
        "delete tensors",
        "Delete each tensor NAME, every tensor a pattern matches, or with -r every tensor\n"
        "under NAME/ too.",
    )
    s.add_argument("names", nargs="+", metavar="NAME", help="tensors, groups (-r) or patterns")
    s.add_argument(
        "-r", "--recursive", action="store_true", help="also delete every tensor under NAME/"
    )

    s = command(
        "status",
        "show every daemon and this host's mounts; exit 1 if any daemon is down",
        "One row per daemon: how this host reaches it, its state, version, tensors, shards\n"
        "(primary/backup), arena use, last snapshot and, with replicas, shards behind another\n"
        "replica. Then each irdma mount of this config on this host and where it logs.\n"
        "A daemon that does not answer within --timeout (2 s) is shown DOWN with the reason.",
    )
    s.add_argument("--json", action="store_true", help="the daemons' rows as JSON records")

    s = command(
        "doctor",
        "check this host for what breaks RDMA and FUSE; exit 1 on any FAIL",
        "One line per check (OK, WARN or FAIL, with the fix) on RDMA devices and GIDs,\n"
        "memlock limits against the arenas, /dev/fuse and fusermount3, and whether every\n"
        "daemon answers within --timeout (2 s).",
    )
    doctormod.add_arguments(s)
    s.set_defaults(run=doctormod.run)

    s = command(
        "drain",
        "move every shard off a daemon and take it out of the cluster (etcd)",
        drainmod.DESCRIPTION,
    )
    drainmod.add_arguments(s)

    s = command(
        "bench",
        "read/write/accumulate throughput and latency",
        "Measure throughput (one tensor of --size) and 4 KiB round trips against the\n"
        "cluster; the tensors it makes under _bench/ are removed afterwards.",
    )
    s.add_argument("--size", default="256MiB", help="tensor size for throughput")
    s.add_argument("--repeat", type=int, default=5, help="rounds per measurement")
    s.add_argument("--latency-iters", type=int, default=2000, help="4 KiB round trips to time")
    s.add_argument("--json", action="store_true", help="the results as one JSON record")
    add_plugin_commands(sub)
    for name, s in sub.choices.items():
        s.formatter_class = HelpFormatter  # plugins' parsers too
        if name != "local":  # it writes its own config
            add_global_options(s, in_subcommand=True)
    return p


def add_plugin_commands(sub: argparse._SubParsersAction) -> None:
    """Subcommands other irdma packages provide (``irdma mount`` from irdma_fuse).

    They register through the ``irdma.commands`` entry point group, so this
    package never imports them.
    """
    for ep in entry_points(group="irdma.commands"):
        try:
            ep.load()(sub)
        except Exception as exc:  # a broken plugin must not break the other commands
            print(f"irdma: command {ep.name!r} unavailable: {exc}", file=sys.stderr)


def complete(parser: argparse.ArgumentParser) -> None:
    """Shell completion through argcomplete, when the shell asks for it and it is installed.

    argcomplete sets _ARGCOMPLETE when completing; only then is it imported, so
    an ordinary run pays nothing for it.
    """
    if "_ARGCOMPLETE" not in os.environ:
        return
    try:
        import argcomplete
    except ImportError:
        return
    argcomplete.autocomplete(parser)


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "local":
        return localmod.main(args)
    if getattr(args, "run", None) is not None:
        return args.run(args)
    config = load_config(args.config)
    timeout = args.timeout
    if timeout is None and args.command == "status":
        timeout = min(config.timeout, STATUS_TIMEOUT)

    async def run() -> int:
        async with AsyncClient(config, timeout=timeout) as client:
            return await CLIENT_COMMANDS[args.command](client, args)

    return trio.run(run)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    complete(parser)
    args = parser.parse_args(argv)
    return guarded("irdma", lambda: dispatch(args))


if __name__ == "__main__":
    sys.exit(main())

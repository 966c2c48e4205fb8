"""`--prometheus URL` and its options (global, as --hosts), and what they build."""

from __future__ import annotations

import argparse

from gputop.core.errors import UsageError

PROM_COMMANDS = ("top", "watch")


def add_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    default = argparse.SUPPRESS if suppress else None
    add = parser.add_argument
    add("--prometheus", metavar="URL", default=default,
        help="the fleet and its jobs read from a Prometheus server (gputop exporter and "
             "dcgm-exporter series), for the live monitor and `watch`: no connection to any node")
    add("--prom-bearer-token-file", metavar="FILE", default=default,
        help="send the token in FILE as `Authorization: Bearer` to --prometheus")
    add("--prom-user", metavar="NAME", default=default,
        help="basic-auth user for --prometheus (the password from --prom-password-file)")
    add("--prom-password-file", metavar="FILE", default=default,
        help="basic-auth password for --prometheus, read from FILE (never on the command line)")
    add("--prom-ca", metavar="FILE", default=default,
        help="CA certificate(s) to check an https --prometheus against")
    add("--prom-cert", metavar="FILE", default=default,
        help="client certificate for --prometheus (PEM; with --prom-key if the key is apart)")
    add("--prom-key", metavar="FILE", default=default, help="client key for --prom-cert")
    add("--prom-timeout", metavar="S", type=float, default=default,
        help="seconds a refresh's queries may take, at the server and here, reads included: "
             "one deadline (default 10)")
    add("--prom-max-series", metavar="N", type=int, default=default,
        help="series one query may answer (default 200000: each query answers one series per "
             "GPU at most, aggregated on the server); a larger answer is refused while read")
    add("--user", metavar="NAME", default=default,
        help="with --prometheus: only GPUs whose series carry user=NAME")
    add("--partition", metavar="NAME", default=default,
        help="with --prometheus: only GPUs whose series carry partition=NAME")
    add("--namespace", metavar="NS", default=default,
        help="with --prometheus: only GPUs of pods in Kubernetes namespace NS")
    add("--label", metavar="NAME=VALUE", action="append",
        default=argparse.SUPPRESS if suppress else [],
        help="with --prometheus: only GPUs whose series carry this label (repeat for several)")


def prometheus_requested(args: argparse.Namespace) -> bool:
    return getattr(args, "prometheus", None) is not None


def check_command(args: argparse.Namespace, command: str) -> None:
    if prometheus_requested(args) and command not in PROM_COMMANDS:
        raise UsageError(f"--prometheus goes with the live monitor and `watch`, not `{command}`")
    if not prometheus_requested(args):
        for name in ("user", "partition", "namespace", "prom_bearer_token_file", "prom_user"):
            if getattr(args, name, None) is not None:
                raise UsageError(f"--{name.replace('_', '-')} goes with --prometheus URL")


def client_from_args(args: argparse.Namespace):
    from gputop.fleet.prometheus.client import (
        MAX_SERIES,
        TIMEOUT_S,
        PromAuth,
        PromClient,
        PromError,
    )

    timeout = getattr(args, "prom_timeout", None) or TIMEOUT_S
    if not (0.1 <= timeout <= 300):
        raise UsageError("--prom-timeout must be between 0.1 and 300 seconds")
    max_series = getattr(args, "prom_max_series", None) or MAX_SERIES
    if max_series < 1:
        raise UsageError("--prom-max-series must be a positive number of series")
    if getattr(args, "prom_password_file", None) and getattr(args, "prom_user", None) is None:
        raise UsageError("--prom-password-file goes with --prom-user")
    auth = PromAuth(bearer_token_file=getattr(args, "prom_bearer_token_file", None),
                    username=getattr(args, "prom_user", None),
                    password_file=getattr(args, "prom_password_file", None),
                    ca_file=getattr(args, "prom_ca", None),
                    cert_file=getattr(args, "prom_cert", None),
                    key_file=getattr(args, "prom_key", None))
    try:
        return PromClient(args.prometheus, auth, timeout=timeout, max_series=max_series)
    except PromError as exc:
        raise UsageError(str(exc)) from None


def filters_from_args(args: argparse.Namespace):
    from gputop.fleet.prometheus.sources import Filters

    try:
        return Filters.make(getattr(args, "user", None), getattr(args, "partition", None),
                            getattr(args, "namespace", None), getattr(args, "label", None) or ())
    except ValueError as exc:
        raise UsageError(str(exc)) from None

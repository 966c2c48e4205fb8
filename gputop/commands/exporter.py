"""`gputop exporter`: a Prometheus endpoint with GPU, host, job and finding metrics."""

from __future__ import annotations

import argparse
import signal
import sys

from gputop.core.errors import UsageError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from gputop.exporter import DEFAULT_LISTEN

    p = sub.add_parser(
        "exporter",
        parents=[common],
        help="serve GPU, host, training-job and finding metrics to Prometheus",
        description="Sample every --interval on a thread of its own and serve the newest "
        "sample at /metrics: GPU metrics named after dcgm-exporter's, the host, the step "
        "telemetry of training jobs with the gputop agent, and the live findings "
        "(gputop_finding_active{id,severity,gpu}, gputop_finding_active_seconds_total). "
        "Binds to localhost unless told otherwise. Ready alert rules and a Grafana "
        "dashboard are in deploy/ (see docs/exporter.md).",
    )
    p.add_argument("--listen", metavar="HOST:PORT", default=DEFAULT_LISTEN,
                   help=f"address to serve on (default {DEFAULT_LISTEN}; 0.0.0.0:9835 for "
                        "every interface)")
    p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate (PEM)")
    p.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    p.add_argument("--tls-client-ca", metavar="FILE",
                   help="require client certificates signed by this CA (mutual TLS)")
    p.add_argument("--basic-auth-file", metavar="FILE",
                   help="require HTTP basic auth: FILE holds user:password lines and must be "
                        "readable by its owner only (chmod 600)")


def run(args: argparse.Namespace) -> int:
    from gputop import __version__
    from gputop.exporter.server import BasicAuth, parse_listen, serve, tls_context

    listen = parse_listen(args.listen)
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        raise UsageError("--tls-client-ca needs --tls-cert and --tls-key")
    context = tls_context(args.tls_cert, args.tls_key, args.tls_client_ca) \
        if args.tls_cert else None
    auth = BasicAuth(args.basic_auth_file) if args.basic_auth_file else None

    from prometheus_client.registry import CollectorRegistry

    from gputop.client.session import open_sampler
    from gputop.diagnostics.live.mig import LiveDiagnosis  # MIG devices one by one
    from gputop.exporter.rendered import RenderedExposition
    from gputop.exporter.sampling import PublishedFamilies, SamplingThread

    stop = _stop_on_signals()
    try:  # collectors without describe() (ours) are asked for a name[] filter's families
        registry = CollectorRegistry(auto_describe=False, support_collectors_without_names=True)
    except TypeError:  # prometheus-client before 0.21: a name[] filter finds nothing
        registry = CollectorRegistry(auto_describe=False)
    published = PublishedFamilies(__version__)
    registry.register(published)
    try:
        from prometheus_client import ProcessCollector

        ProcessCollector(registry=registry)  # the exporter's own CPU and memory
    except Exception:
        pass
    rendered = RenderedExposition(registry)  # a scrape is served these bytes
    try:
        with open_sampler(args.demo, args.gpus, args.seed) as sampler:
            if not sampler.driver.available:
                print(f"gputop exporter: {sampler.driver.error}; serving host metrics only "
                      "(try --demo tour)", file=sys.stderr, flush=True)
            thread = SamplingThread(sampler, LiveDiagnosis(), published, args.interval,
                                    __version__, after_publish=rendered.refresh)
            thread.tick(0.0)  # the first scrape already has data
            server, _ = serve(registry, listen, context, auth, rendered)
            scheme = "https" if context else "http"
            print(f"gputop exporter: serving {scheme}://{listen.url_host}:{server.server_port}"
                  f"/metrics (sampling every {args.interval:g} s)", file=sys.stderr, flush=True)
            if not listen.loopback and context is None and auth is None:
                print("gputop exporter: warning: serving every interface without TLS or "
                      "basic auth (see --tls-cert, --basic-auth-file)", file=sys.stderr,
                      flush=True)
            thread.start()
            try:
                while not stop.wait(0.5):
                    pass
            finally:
                thread.stop()
                server.shutdown()
                server.server_close()
                thread.join(5.0)
    except KeyboardInterrupt:
        pass
    return 0


def _stop_on_signals():
    import threading

    stop = threading.Event()

    def handler(*_: object) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, handler)
    return stop

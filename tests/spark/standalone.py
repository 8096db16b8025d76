"""A Spark standalone cluster on this machine, for the cluster tests: a master and workers started
from pyspark's own installation (bin/spark-class), on 127.0.0.1 and random ports, everything under
one temporary directory, stopped with all its processes (executors, their Python workers).

The executors must get pgbroker from what the driver ships, as on machines that do not share the
driver's files. So the workers run their executors' Python from a bare virtual environment that
sees this one's dependencies (psycopg, pyarrow, numpy, pyspark) but not pgbroker, whose
editable install is a .pth file that only this environment's own site-packages runs. Driver and
executors are told the same PYSPARK_PYTHON, a script that is the driver's Python on the driver
and the bare one where the workers set PGBROKER_TEST_WORKER_PYTHON: one path, another Python on
each "machine".
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.jvm import SHORT_LIVED_JVM_OPTIONS, spark_defaults

WORKER_MEMORY = "1g"
EXECUTOR_MEMORY = "512m"
DAEMON_MEMORY = "256m"  # heap of the master and worker daemons themselves


@dataclass
class StandaloneCluster:
    root: Path
    workers: int = 2
    url: str = ""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def spark_home(self) -> Path:
        """pyspark's installation, which has Spark's jars and bin/spark-class."""
        import pyspark

        return Path(pyspark.__file__).parent

    @property
    def conf_dir(self) -> Path:
        return self.root / "conf"

    @property
    def python(self) -> Path:
        """PYSPARK_PYTHON for drivers and executors alike."""
        return self.root / "bin" / "python"

    @property
    def executor_python(self) -> Path:
        return self.root / "executor-env" / "bin" / "python"

    def worker_dir(self, number: int) -> Path:
        return self.root / f"worker-{number}"

    def start(self, timeout: float = 120) -> None:
        self._write_conf()
        self._make_pythons()
        master_log = self.root / "master.log"
        self._spawn("master", self.root, [
            "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
            "--webui-port", "0",
        ])  # fmt: skip
        found = self._wait_for_log(master_log, re.compile(r"Starting Spark master at (spark://\S+)"), timeout)
        self.url = found[1]
        for number in range(1, self.workers + 1):
            work = self.worker_dir(number)
            work.mkdir()
            self._spawn(f"worker-{number}", work, [
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", "0",
                "--webui-port", "0", "--cores", "1", "--memory", WORKER_MEMORY, "--work-dir", str(work),
                self.url,
            ])  # fmt: skip
        deadline = time.monotonic() + timeout
        while master_log.read_text(errors="replace").count("Registering worker ") < self.workers:
            self._check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(f"the workers did not register within {timeout:.0f} s:\n{self.logs()}")
            time.sleep(0.2)

    def driver_conf(self) -> list[str]:
        """--conf arguments of a driver on this cluster: loopback only, no UI, small executors,
        and no task before both executors are there (so that both take part)."""
        conf = {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.ui.enabled": "false",
            "spark.executor.memory": EXECUTOR_MEMORY,
            "spark.executor.cores": "1",
            "spark.cores.max": str(self.workers),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
            "spark.local.dir": str(self.root / "driver-local"),
        }
        return [arg for key, value in conf.items() for arg in ("--conf", f"{key}={value}")]

    def driver_env(self) -> dict[str, str]:
        # Its temporary files (the zips it ships) go with the cluster's directory.
        tmp = self.root / "driver-tmp"
        tmp.mkdir(exist_ok=True)
        env = {**os.environ, "PYSPARK_PYTHON": str(self.python), "SPARK_LOCAL_IP": "127.0.0.1"}
        env.pop("PYSPARK_DRIVER_PYTHON", None)
        env.update(SPARK_CONF_DIR=str(self.conf_dir), TMPDIR=str(tmp))
        return env

    def executor_dirs(self) -> list[Path]:
        """The executors' working directories: <worker dir>/<app id>/<executor id>."""
        return sorted(p for n in range(1, self.workers + 1) for p in self.worker_dir(n).glob("app-*/*"))

    def kill_executor(self, executor_dir: Path) -> None:
        """SIGKILL the executor JVM working in ``executor_dir``, as a lost machine would. (Its
        Python workers go with it; its worker starts another executor for the application.)"""
        ps = subprocess.run(["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True, check=True)
        for line in ps.stdout.splitlines():
            pid, _, args = line.strip().partition(" ")
            if "CoarseGrainedExecutorBackend" not in args or str(self.root) not in args:
                continue
            with contextlib.suppress(OSError):
                if Path(os.readlink(f"/proc/{pid}/cwd")) == executor_dir:
                    os.kill(int(pid), signal.SIGKILL)
                    return
        raise AssertionError(f"no executor running in {executor_dir}:\n{ps.stdout}")

    def stop(self, timeout: float = 30) -> None:
        """Stop the workers (which stop their executors), then the master; kill what lingers."""
        for process in reversed(self.processes):
            if process.poll() is None:
                _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
        # The process groups hold the executors and their Python workers too.
        for process in self.processes:
            _signal_group(process, signal.SIGKILL)
            process.wait()

    def survivors(self) -> list[str]:
        """Processes still running whose command line mentions the cluster's directory (every
        JVM has its conf directory on the class path; the executors' Python lives in it)."""
        ps = subprocess.run(["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True, check=True)
        return [line.strip() for line in ps.stdout.splitlines() if str(self.root) in line]

    def logs(self, tail: int = 40) -> str:
        parts = []
        for log in sorted(self.root.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    # -- internals ------------------------------------------------------------------------------

    def _write_conf(self) -> None:
        self.conf_dir.mkdir(parents=True)
        # No REST submission server (it would listen on 6066 on every interface).
        defaults = "spark.master.rest.enabled false\n" + spark_defaults()  # and short-lived JVMs
        (self.conf_dir / "spark-defaults.conf").write_text(defaults)

    def _make_pythons(self) -> None:
        env_dir = self.executor_python.parent.parent
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
        purelib = Path(sysconfig.get_paths()["purelib"])
        ask = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
        site = Path(
            subprocess.run(
                [str(self.executor_python), "-c", ask],
                capture_output=True, text=True, check=True,
            ).stdout.strip()
        )  # fmt: skip
        # A plain path line: the directory joins sys.path, but its own .pth files (pgbroker's
        # editable install among them) are not run.
        (site / "driver-site-packages.pth").write_text(f"{purelib}\n")
        self.python.parent.mkdir()
        self.python.write_text(
            '#!/bin/sh\nexec "${PGBROKER_TEST_WORKER_PYTHON:-' + sys.executable + '}" "$@"\n'
        )
        self.python.chmod(0o755)

    def _daemon_env(self, cwd: Path) -> dict[str, str]:
        # Not the test's environment: no PYTHONPATH or anything else pointing at the source tree.
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(cwd),
            "SPARK_HOME": str(self.spark_home),
            "SPARK_CONF_DIR": str(self.conf_dir),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(cwd / "local"),
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_DAEMON_JAVA_OPTS": SHORT_LIVED_JVM_OPTIONS,
            "PGBROKER_TEST_WORKER_PYTHON": str(self.executor_python),
        }
        if "JAVA_HOME" in os.environ:
            env["JAVA_HOME"] = os.environ["JAVA_HOME"]
        return env

    def _spawn(self, name: str, cwd: Path, args: list[str]) -> None:
        with (self.root / f"{name}.log").open("wb") as log:
            # Its own process group, to stop it with everything it starts; spark-class execs java.
            self.processes.append(
                subprocess.Popen(
                    [str(self.spark_home / "bin" / "spark-class"), *args],
                    cwd=cwd,
                    env=self._daemon_env(cwd),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def _wait_for_log(self, log: Path, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            found = pattern.search(log.read_text(errors="replace")) if log.exists() else None
            if found:
                return found
            self._check_alive()
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout:.0f} s waiting for {pattern.pattern}:\n{self.logs()}"
                )
            time.sleep(0.2)

    def _check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise AssertionError(f"a Spark daemon exited with {process.returncode}:\n{self.logs()}")


def _signal_group(process: subprocess.Popen[Any], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


class Driver:
    """A driver (the pgbroker CLI or spark-submit) running in its own process group, with its JVM
    and Python workers; its output goes to a file (a pipe left unread would stall it)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> None:
        self.argv = argv
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def finish(self, timeout: float) -> tuple[int, str]:
        """Its exit code and output; killed, and an AssertionError, if it runs past ``timeout``."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            output = self.log.read_text(errors="replace")
            raise AssertionError(
                f"{self.argv[0]} did not finish within {timeout:.0f} s:\n{output[-5000:]}"
            ) from None
        return code, self.log.read_text(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            _signal_group(self.process, signal.SIGKILL)
        self.process.wait()


def run_driver(
    argv: list[str], env: dict[str, str], cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a driver to its end (killed with everything it started, on timeout or failure)."""
    driver = Driver(argv, env, cwd, cwd / f"driver-{time.monotonic_ns()}.log")
    try:
        code, output = driver.finish(timeout)
    finally:
        driver.kill()
    return subprocess.CompletedProcess(argv, code, output)

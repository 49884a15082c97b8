"""docker-compose.yml: Debian's `docker-compose config -q` accepts it, and its structure is what
a team deployment needs (services, healthchecks, start order, volumes, GPU reservation), with no
secret written in it. The Dockerfiles are checked by reading (no Docker engine here)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.team.conftest import ROOT, clean_env

COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = ROOT / ".env.example"
SERVICES = {"postgres", "redis", "migrate", "app", "worker-gpu", "worker-cpu"}
TORCHDECK = ("migrate", "app", "worker-gpu", "worker-cpu")
# The secrets .env.example leaves empty: compose must refuse to start without them.
FILLED = {
    "POSTGRES_PASSWORD": "pg-test-password",
    "REDIS_PASSWORD": "redis-test-password",
    "TORCHDECK_DATABASE_URL": "postgresql://torchdeck:pg-test-password@postgres:5432/torchdeck",
    "TORCHDECK_BROKER_URL": "redis://:redis-test-password@redis:6379/0",
}


def example_env() -> dict[str, str]:
    out = {}
    for ln in ENV_EXAMPLE.read_text().splitlines():
        if ln.strip() and not ln.lstrip().startswith("#"):
            k, _, v = ln.partition("=")
            out[k.strip()] = v
    return out


def compose(args: list[str], env_file: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.fail(
            "docker-compose is not installed (make test installs it: apt-get install docker-compose)", pytrace=False
        )
    # A clean environment: only the env file configures it (the shell's variables would win otherwise).
    return subprocess.run(
        [exe, "--env-file", str(env_file), "-f", str(COMPOSE), *args],
        cwd=env_file.parent,
        env=clean_env(),
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def write_env(path: Path, values: dict[str, str]) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict:
    """The configuration docker-compose itself resolves from .env.example with the secrets filled in."""
    env = write_env(tmp_path_factory.mktemp("compose") / "test.env", {**example_env(), **FILLED})
    done = compose(["config"], env)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def test_config_quiet_passes_with_the_documented_variables(tmp_path):
    env = write_env(tmp_path / "test.env", {**example_env(), **FILLED})
    done = compose(["config", "-q"], env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("secret", sorted(FILLED))
def test_a_missing_secret_stops_compose_with_its_name(tmp_path, secret):
    values = {**example_env(), **FILLED}
    values[secret] = ""
    done = compose(["config", "-q"], write_env(tmp_path / "test.env", values))
    assert done.returncode != 0
    assert f"set {secret} in .env" in done.stderr


def test_the_example_itself_holds_no_secret(tmp_path):
    """As shipped, .env.example has every secret empty: copying it without filling in fails."""
    values = example_env()
    for secret in (*FILLED, "TORCHDECK_OIDC_CLIENT_SECRET", "TORCHDECK_OIDC_COOKIE_SECRET", "AWS_SECRET_ACCESS_KEY"):
        assert values[secret] == "", f"{secret} has a value in .env.example"
    assert compose(["config", "-q"], write_env(tmp_path / "test.env", values)).returncode != 0


def test_services_and_start_order(resolved):
    services = resolved["services"]
    assert set(services) == SERVICES
    assert services["migrate"]["command"] == ["torchdeck", "db", "upgrade"]
    assert services["migrate"]["restart"] == "no"
    assert services["migrate"]["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in ("app", "worker-gpu", "worker-cpu"):
        deps = services[name]["depends_on"]
        assert deps["migrate"] == {"condition": "service_completed_successfully"}, name
        assert deps["redis"] == {"condition": "service_healthy"}, name
    assert services["app"]["command"][:2] == ["torchdeck", "ui"]
    assert services["worker-gpu"]["command"] == ["torchdeck", "worker", "--gpus", "0", "--queues", "gpu"]
    assert services["worker-cpu"]["command"] == ["torchdeck", "worker", "--queues", "cpu", "--workers", "1"]


@pytest.mark.parametrize(("value", "workers"), [("4", "4"), ("", "1")])
def test_the_cpu_worker_count_comes_from_the_environment(tmp_path, value, workers):
    """TORCHDECK_CPU_WORKERS CPU runs side by side in `worker-cpu` (empty: one); the GPU workers stay one per GPU."""
    env = write_env(tmp_path / "test.env", {**example_env(), **FILLED, "TORCHDECK_CPU_WORKERS": value})
    done = compose(["config"], env)
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    assert services["worker-cpu"]["command"] == ["torchdeck", "worker", "--queues", "cpu", "--workers", workers]
    assert "--workers" not in services["worker-gpu"]["command"]


def test_healthchecks(resolved):
    services = resolved["services"]
    for name in SERVICES - {"migrate"}:
        check = services[name].get("healthcheck")
        assert check and check["test"], f"{name} has no healthcheck"
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert "PONG" in " ".join(services["redis"]["healthcheck"]["test"])
    assert "/_stcore/health" in " ".join(services["app"]["healthcheck"]["test"])
    assert "gpu0@" in " ".join(
        services["worker-gpu"]["healthcheck"]["test"]
    )  # the node name `torchdeck worker --gpus 0` gives
    assert "cpu@" in " ".join(services["worker-cpu"]["healthcheck"]["test"])


def test_named_volumes(resolved):
    assert set(resolved["volumes"]) == {"pgdata", "redisdata", "artifacts"}
    services = resolved["services"]
    assert any(v.startswith("pgdata:/var/lib/postgresql/data") for v in services["postgres"]["volumes"])
    for name in ("app", "worker-gpu", "worker-cpu"):
        assert any(v.startswith("artifacts:/data/artifacts") for v in services[name]["volumes"]), name
        assert services[name]["environment"]["TORCHDECK_ARTIFACTS"] == "/data/artifacts"


def test_one_gpu_per_gpu_worker(resolved):
    devices = resolved["services"]["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}]
    assert "deploy" not in resolved["services"]["worker-cpu"]
    assert resolved["services"]["worker-gpu"]["shm_size"]  # DataLoader workers need more than 64 MB


def test_every_torchdeck_service_gets_the_same_configuration(resolved):
    services = resolved["services"]
    shared = (
        "TORCHDECK_DATABASE_URL",
        "TORCHDECK_BROKER_URL",
        "TORCHDECK_ARTIFACTS",
        "TORCHDECK_S3_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_DEFAULT_REGION",
    )
    for name in TORCHDECK:
        env = services[name]["environment"]
        for key in shared:
            assert env[key] == services["app"]["environment"][key], (name, key)
    assert services["app"]["environment"]["TORCHDECK_DATABASE_URL"] == FILLED["TORCHDECK_DATABASE_URL"]


def test_no_secret_is_written_in_the_compose_file():
    raw = yaml.safe_load(COMPOSE.read_text())
    secretish = re.compile(r"PASSWORD|SECRET|TOKEN|_KEY|_URL$|_URI$|ADMINS")

    def literal(value) -> bool:
        return isinstance(value, str) and not value.startswith("${")

    for name, service in raw["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if secretish.search(key):
                assert not literal(value), f"{name}: {key} is written in the file; take it from the environment"
                assert re.fullmatch(r"\$\{" + key + r"(:[-?][^}]*)?\}", value), (
                    f"{name}: {key} comes from another variable"
                )
    text = COMPOSE.read_text()
    assert not re.search(r"://[^:/\s]*:[^@$\s]+@", text), "a URL with a password is written in the compose file"


def test_every_variable_is_documented_in_the_example():
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", COMPOSE.read_text()))
    documented = set(example_env())
    assert used - documented == set(), "add these to .env.example with what they mean"
    assert documented - used == set(), "documented in .env.example but unused in docker-compose.yml"
    for block in ENV_EXAMPLE.read_text().split("\n\n"):  # each variable's paragraph explains it
        lines = block.strip().splitlines()
        if any(not ln.startswith("#") for ln in lines):
            assert any(ln.startswith("#") and len(ln) > 20 for ln in lines), f"no explanation for:\n{block}"


def test_sign_in_variables_are_the_ones_the_app_reads(resolved):
    from app.auth import ADMINS_ENV, ALLOW_ENVS, GROUPS_CLAIM_ENV, MODE_ENV, OIDC_ENV

    env = resolved["services"]["app"]["environment"]
    for var in (*OIDC_ENV.values(), MODE_ENV, ADMINS_ENV, *ALLOW_ENVS, GROUPS_CLAIM_ENV):
        assert var in env, var
    assert env[MODE_ENV] == "team"


def test_dockerfiles():
    app_df = (ROOT / "docker" / "app.Dockerfile").read_text()
    worker_df = (ROOT / "docker" / "worker.Dockerfile").read_text()
    for df in (app_df, worker_df):  # the public slim image by default, another (scripts/debian-base.sh) by argument
        assert re.search(r"^ARG BASE_IMAGE=python:3\.1[1-9]-slim", df, re.MULTILINE) and "FROM ${BASE_IMAGE}" in df
        assert "python3 -m venv /opt/venv" in df and "PATH=/opt/venv/bin:$PATH" in df
        assert "dockerfile:1" not in df  # a syntax image to pull: no build where no registry is reachable
    assert "import torch" in app_df and "exit 1" in app_df  # the build fails if torch gets in
    assert not re.search(r"pip install[^\n]*torch", app_df)
    assert "nvidia/cuda" not in worker_df.split("# BASE_IMAGE")[1]  # the torch wheels carry CUDA: no CUDA base image
    pins = {
        d.split("==")[0]: d
        for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"] + _worker_extra()
        if "==" in d
    }
    for pkg in ("torch", "torchvision"):
        assert pins[pkg] in worker_df, f"worker.Dockerfile must install {pins[pkg]} (pyproject's pin)"
    assert '".[worker]"' in worker_df
    for df in (app_df, worker_df):
        assert "USER torchdeck" in df and "--uid 10001" in df  # same owner of the shared artifacts volume
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".env" in ignored  # never copy the local venv or the secrets into an image


def _worker_extra() -> list[str]:
    return (
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        .get("optional-dependencies", {})
        .get("worker", [])
    )


def test_the_app_image_install_has_no_torch():
    """docker/app.Dockerfile runs `pip install .`: torch must be in the [worker] extra, not the base."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {re.split(r"[<>=\[; ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert not base & {"torch", "torchvision", "onnxruntime"}, "move them to [project.optional-dependencies] worker"
    worker = " ".join(_worker_extra())
    assert "torch==" in worker and "torchvision==" in worker

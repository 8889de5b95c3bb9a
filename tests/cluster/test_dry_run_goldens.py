"""``bench sweep --cluster slurm|kubernetes --dry-run`` for the deployments that outgrow one
node: vLLM PP across nodes, vLLM DP+EP across nodes, SGLang across nodes and a vLLM P/D pair,
compared with golden files (tests/cluster/data; ``BENCH_UPDATE_GOLDEN=1`` rewrites them after
a reviewed change). The Kubernetes manifests pass ``kubernetes-validate --strict`` for the
built-in kinds (Deployment, Service, Job; and each LeaderWorkerSet pod template as a
PodTemplate), and the LeaderWorkerSet's own fields a schema written from the LWS v1 API types
(api/leaderworkerset/v1/leaderworkerset_types.go); skipped where those packages are absent.
None of this ran on a live cluster."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from bench_llm.bench.sweep import cluster as sweep_cluster
from bench_llm.bench.sweep.spec import LoadSpec, MatrixSpec, SweepSpec
from bench_llm.launch import engines
from bench_llm.launch.kube import LWS_API, manifests, manifests_yaml
from bench_llm.launch.placement import ClusterSpec

DATA = Path(__file__).parent / "data"
CASES: dict[str, tuple[str, MatrixSpec]] = {
    "vllm-pp-across-nodes": ("vllm", MatrixSpec(tp=(8,), pp=(2,))),
    "vllm-dp-ep-across-nodes": ("vllm", MatrixSpec(tp=(2,), dp=(8,), ep=(16,))),
    "sglang-across-nodes": ("sglang", MatrixSpec(tp=(16,))),
    "vllm-pd-pair": ("vllm", MatrixSpec(tp=(8,), disagg=("1:1",))),
}
K8S_VERSION = "1.33"


@pytest.fixture(autouse=True)
def _programs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engines, "vllm_command", lambda: ["vllm"])
    monkeypatch.setenv("BENCH_SGLANG_PYTHON", "python3")


def _spec(case: str, manager: str) -> SweepSpec:
    engine, matrix = CASES[case]
    cluster = ClusterSpec(manager=manager, gpus_per_node=8, sbatch_args=("--partition=gpu", "--account=team"),
                          gres_type="h100", image=f"{engine}-image:tag", client_image="bench-image:tag")  # fmt: skip
    spec = SweepSpec(model="org/M", engine=engine, matrix=matrix, loads=LoadSpec(rates=(2.0,)), cluster=cluster)
    spec.validate()
    return spec


def _text(case: str, manager: str) -> str:
    text = "\n".join(sweep_cluster.dry_run_lines(_spec(case, manager))) + "\n"
    return text.replace(sys.executable, "python3")


@pytest.mark.parametrize("manager", ["slurm", "kubernetes"])
@pytest.mark.parametrize("case", list(CASES))
def test_golden(case: str, manager: str) -> None:
    path = DATA / f"{manager}-{case}.txt"
    text = _text(case, manager)
    if os.environ.get("BENCH_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with BENCH_UPDATE_GOLDEN=1 and review it"
    assert text == path.read_text(), f"{path} differs (BENCH_UPDATE_GOLDEN=1 rewrites it after review)"
    assert "skipped" not in text.splitlines()[1]


def _objects(case: str) -> list[dict[str, Any]]:
    from bench_llm.bench.sweep.cell import cell_engine
    from bench_llm.bench.sweep.matrix import expand

    spec = _spec(case, "kubernetes")
    assert spec.cluster is not None
    (cell,) = expand(spec)
    ls = sweep_cluster.launch_spec(cell_engine(spec, cell.config))
    return manifests(ls, cell.cell_id, spec.cluster, ["bench", "run"])


#: The LeaderWorkerSet fields bench writes, as the LWS v1 API types declare them (enums and
#: required fields there); pod templates are checked as core/v1 PodTemplates.
LWS_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": LWS_API},
        "kind": {"const": "LeaderWorkerSet"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["leaderWorkerTemplate"],
            "properties": {
                "replicas": {"type": "integer", "minimum": 0},
                "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
                "leaderWorkerTemplate": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["workerTemplate"],
                    "properties": {
                        "leaderTemplate": {"type": "object"},
                        "workerTemplate": {"type": "object"},
                        "size": {"type": "integer", "minimum": 1},
                        "restartPolicy": {"enum": ["Default", "RecreateGroupOnPodRestart", "RecreateGroupAfterStart",
                                                   "None"]},  # fmt: skip
                    },
                },
            },
        },
    },
}


@pytest.mark.parametrize("case", list(CASES))
def test_manifests_validate(case: str) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate not installed (pip install kubernetes-validate)")
    jsonschema = pytest.importorskip("jsonschema")
    objects = _objects(case)
    kinds = [o["kind"] for o in objects]
    assert kinds[-1] == "Job" and "Service" in kinds
    if case != "vllm-pd-pair":
        assert "LeaderWorkerSet" in kinds
    for obj in objects:
        if obj["apiVersion"] == LWS_API:
            jsonschema.validate(obj, LWS_SCHEMA)
            t = obj["spec"]["leaderWorkerTemplate"]
            assert t["size"] == 2 and t["restartPolicy"] == "RecreateGroupOnPodRestart"
            for name in ("leaderTemplate", "workerTemplate"):
                kv.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": t[name]},
                            K8S_VERSION, strict=True)  # fmt: skip
        else:
            kv.validate(obj, K8S_VERSION, strict=True)
    job = objects[-1]["spec"]["template"]["spec"]
    assert job["nodeSelector"] == {"node-role.kubernetes.io/cpu": "true"}  # the client on a CPU node
    assert "resources" not in job["containers"][0]  # no GPU for the load generator


@pytest.mark.parametrize("case", list(CASES))
def test_yaml_reads_back_as_the_objects(case: str) -> None:
    yaml = pytest.importorskip("yaml")
    spec = _spec(case, "kubernetes")
    from bench_llm.bench.sweep.cell import cell_engine
    from bench_llm.bench.sweep.matrix import expand

    assert spec.cluster is not None
    (cell,) = expand(spec)
    ls = sweep_cluster.launch_spec(cell_engine(spec, cell.config))
    text = manifests_yaml(ls, cell.cell_id, spec.cluster, ["bench", "run"])
    assert [d for d in yaml.safe_load_all(text) if d is not None] == _objects(case)


def _pruned(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The fields of ``obj`` a structural CRD schema does not declare (the API server would drop
    them silently, so a field bench writes there would have no effect)."""
    out: list[str] = []
    if isinstance(obj, dict) and "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        for k, v in obj.items():
            out += [f"{path}/{k}"] if k not in schema["properties"] else _pruned(v, schema["properties"][k], f"{path}/{k}")
    elif isinstance(obj, dict) and isinstance(schema.get("additionalProperties"), dict):
        for k, v in obj.items():
            out += _pruned(v, schema["additionalProperties"], f"{path}/{k}")
    elif isinstance(obj, list) and "items" in schema:
        for i, v in enumerate(obj):
            out += _pruned(v, schema["items"], f"{path}[{i}]")
    return out


@pytest.mark.parametrize("case", [c for c in CASES if c != "vllm-pd-pair"])
def test_leaderworkersets_validate_against_the_official_crd(case: str) -> None:
    """Against LWS's own CRD (config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml of
    github.com/kubernetes-sigs/lws, 1.3 MB, not vendored): give its path in ``BENCH_LWS_CRD``.
    Checked by hand at lws commit 060ab4d: every LeaderWorkerSet valid, no pruned field."""
    path = os.environ.get("BENCH_LWS_CRD")
    if not path or not Path(path).is_file():
        pytest.skip("BENCH_LWS_CRD does not name the LWS CRD file (github.com/kubernetes-sigs/lws, config/crd/bases)")
    yaml = pytest.importorskip("yaml")
    jsonschema = pytest.importorskip("jsonschema")
    crd = yaml.safe_load(Path(path).read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"]
    (lws,) = [o for o in _objects(case) if o["kind"] == "LeaderWorkerSet"]
    jsonschema.validate(lws, schema)
    assert _pruned(lws, schema) == []
    bad = {**lws, "spec": {**lws["spec"], "leaderWorkerTemplate": {**lws["spec"]["leaderWorkerTemplate"], "restartPolicy": "Always", "groupSize": 2}}}
    with pytest.raises(jsonschema.ValidationError):  # the check can fail: an enum the CRD does not allow
        jsonschema.validate(bad, schema)
    assert _pruned(bad, schema) == ["/spec/leaderWorkerTemplate/groupSize"]

"""deploy/kubernetes/, checked offline (no cluster here):

- every resource validates strictly (no field the schema does not name) against Kubernetes' own
  schemas, as kubernetes-validate bundles them, for the oldest and newest version checked; the
  Kubeflow Trainer resources against their CRDs' schemas (tests/deploy/schemas);
- each pod's TF_CONFIG, rendered by running the pod's own command with its hostname and
  environment, is valid TF_CONFIG, names this pod's role and index, and lists every task of the
  job at a DNS name a headless Service of the manifest (or JobSet's) gives exactly that pod, on a
  port the pod listens on;
- every job has a NetworkPolicy covering each of its pods and admitting only its own pods.
"""
import copy
import glob
import json
import os
import subprocess
import sys

import pytest

yaml = pytest.importorskip("yaml")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (requirements.txt)")
import jsonschema  # noqa: E402  (a dependency of kubernetes-validate)

from ttf.distribute import Cluster  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANIFESTS = sorted(glob.glob(os.path.join(ROOT, "deploy", "kubernetes", "*.yaml")))
SCHEMAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas")
K8S_VERSIONS = ("1.29", "1.37")  # the oldest Kubernetes checked (Indexed Jobs, JobSet's needs) and the newest bundled
ENTRYPOINT = "exec /opt/ttf/start_all.sh"


def load(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def test_there_is_a_manifest_for_each_job():
    assert {os.path.basename(p) for p in MANIFESTS} >= {"ps-job.yaml", "sync-job.yaml", "online-job.yaml", "trainjob.yaml"}


def _strict(schema):
    """A CRD's openAPIV3Schema made strict as kubernetes-validate's strict schemas are: an object
    with properties admits no others unless it preserves unknown fields."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema and \
                not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _crd_validator(doc):
    group, version = doc["apiVersion"].split("/")
    path = os.path.join(SCHEMAS, f"{doc['kind'].lower()}-{version}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        crd = json.load(f)
    assert crd["group"] == group
    schema = copy.deepcopy(crd["openAPIV3Schema"])
    schema["properties"]["apiVersion"] = {"const": doc["apiVersion"]}
    schema["properties"]["kind"] = {"const": crd["kind"]}
    return jsonschema.Draft7Validator(_strict(schema))


def validate(doc, version):
    """Raises on any schema error; Kubernetes' kinds through kubernetes-validate, CRDs through theirs."""
    if "." in doc["apiVersion"].split("/")[0] and not doc["apiVersion"].endswith(".k8s.io/v1"):
        validator = _crd_validator(doc)
        assert validator is not None, f"no schema for {doc['apiVersion']} {doc['kind']} in {SCHEMAS}"
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
        if errors:
            raise jsonschema.ValidationError("; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5]))
        return
    kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=os.path.basename)
def test_every_resource_validates_strictly_offline(path, version):
    for doc in load(path):
        try:
            validate(doc, version)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as err:
            pytest.fail(f"{os.path.basename(path)} {doc['kind']}/{doc['metadata']['name']} against {version}: {err}")


def test_strict_validation_refuses_a_misspelt_field():
    """The check above can fail: a field the schema does not name is an error, for Kubernetes' kinds and CRDs."""
    docs = {doc["kind"]: doc for path in MANIFESTS for doc in load(path)}
    statefulset = copy.deepcopy(docs["StatefulSet"])
    statefulset["spec"]["template"]["spec"]["containers"][0]["resource"] = {}  # resources, misspelt
    with pytest.raises(kubernetes_validate.ValidationError, match="resource"):
        validate(statefulset, K8S_VERSIONS[-1])
    trainjob = copy.deepcopy(docs["TrainJob"])
    trainjob["spec"]["trainer"]["numNode"] = 2
    with pytest.raises(jsonschema.ValidationError, match="numNode"):
        validate(trainjob, K8S_VERSIONS[-1])


# ---- pods, their hostnames and their TF_CONFIG -------------------------------------------------

def pods(docs):
    """Every pod the manifest's workloads make: (hostname, subdomain, labels, container, workload kind, ordinal)."""
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        if kind == "StatefulSet":
            template = doc["spec"]["template"]
            for i in range(doc["spec"]["replicas"]):
                yield f"{name}-{i}", doc["spec"]["serviceName"], template, kind, i, name
        elif kind == "Job" and doc["spec"].get("completionMode") == "Indexed":
            template = doc["spec"]["template"]
            for i in range(doc["spec"]["completions"]):
                yield f"{name}-{i}", template["spec"].get("subdomain"), template, kind, i, name
        elif kind == "Deployment":
            for i in range(doc["spec"]["replicas"]):
                yield None, None, doc["spec"]["template"], kind, i, name
        elif kind == "TrainingRuntime":
            jobset = next(d["metadata"]["name"] for d in docs if d["kind"] == "TrainJob"
                          and d["spec"]["runtimeRef"]["name"] == name)
            assert doc["spec"]["template"]["spec"]["network"]["enableDNSHostnames"]
            for rjob in doc["spec"]["template"]["spec"]["replicatedJobs"]:
                assert rjob["replicas"] == 1  # the DNS names below assume job index 0
                template = rjob["template"]["spec"]["template"]
                for i in range(rjob["template"]["spec"]["completions"]):
                    # JobSet names pod i of job 0 of a replicated job so, in the subdomain <jobset>.
                    yield f"{jobset}-{rjob['name']}-0-{i}", jobset, template, "JobSet", i, jobset


def render_tf_config(container, hostname, index, docs, jobset, tmp_path):
    """Runs the container's own command (bash) with its environment, the entrypoint replaced by a
    script printing TF_CONFIG: what the pod would start with."""
    command = container.get("command") or []
    if command[:2] != ["/bin/bash", "-c"]:
        return None
    script = command[2]
    assert script.count(ENTRYPOINT) == 1, script
    show = tmp_path / "show.sh"
    show.write_text('#!/bin/sh\nprintf "%s" "$TF_CONFIG"\n')
    show.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "HOSTNAME": hostname, "JOB_COMPLETION_INDEX": str(index)}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif "configMapKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["configMapKeyRef"]
            config_map = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == ref["name"])
            env[var["name"]] = config_map["data"][ref["key"]]
        else:
            assert var["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['jobset.sigs.k8s.io/jobset-name']"
            env[var["name"]] = jobset
    proc = subprocess.run(["bash", "-c", script.replace(ENTRYPOINT, f"exec {show}"), *command[3:]], env=env,
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def headless_services(docs):
    return {d["metadata"]["name"]: d for d in docs
            if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"}


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("path", [p for p in MANIFESTS if "online" not in p], ids=os.path.basename)
def test_each_pods_tf_config_names_its_role_and_every_task_at_a_service_name(path, tmp_path):
    docs = load(path)
    services = headless_services(docs)
    by_host, rendered = {}, {}
    for hostname, subdomain, template, kind, index, jobset in pods(docs):
        container = template["spec"]["containers"][0]
        text = render_tf_config(container, hostname, index, docs, jobset, tmp_path)
        assert text is not None, f"{hostname}: no TF_CONFIG"
        config = Cluster.from_tf_config(text)
        by_host[f"{hostname}.{subdomain}"] = (template, container, config.task_type, index, kind)
        rendered[hostname] = config
    clusters = {json.dumps({k: list(v) for k, v in c.cluster.items()}, sort_keys=True) for c in rendered.values()}
    assert len(clusters) == 1, f"the pods disagree on the cluster: {clusters}"
    cluster = next(iter(rendered.values())).cluster
    assert sum(len(v) for v in cluster.values()) == len(rendered), "the cluster lists other tasks than the pods made"
    for task_type, addresses in cluster.items():
        for index, address in enumerate(addresses):
            host, _, port = address.rpartition(":")
            assert host in by_host, f"{task_type} {index} at {host}: no pod of the manifest has that name"
            template, container, pod_type, pod_index, kind = by_host[host]
            assert (pod_type, pod_index) == (task_type, index), f"{host} runs {pod_type} {pod_index}, not {task_type} {index}"
            assert int(port) in [p["containerPort"] for p in container.get("ports", [])], f"{host} does not listen on {port}"
            service = host.split(".", 1)[1]
            if kind == "JobSet":
                continue  # JobSet makes the headless Service named for the JobSet itself
            assert service in services, f"{host}: no headless Service {service} in {os.path.basename(path)}"
            spec = services[service]["spec"]
            assert selects(spec["selector"], template["metadata"]["labels"]), f"Service {service} does not select {host}"
            assert int(port) in [p["port"] for p in spec["ports"]] and spec.get("publishNotReadyAddresses")
    shape = "synchronous" if "sync" in os.path.basename(path) else "parameter-server"
    assert all(c.shape == shape for c in rendered.values())
    # And start_all.sh's reading of it (the same module, as the launcher runs it) takes each pod's role.
    hostname, config = next(iter(rendered.items()))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "ttf", "launch", "tf_config.py"), "--shell"],
                          env={**os.environ, "TF_CONFIG": config.to_json()}, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and f"role={config.task_type}" in proc.stdout, proc.stderr


@pytest.mark.parametrize("path", MANIFESTS, ids=os.path.basename)
def test_every_job_has_a_network_policy_admitting_only_its_own_pods_to_its_ports(path):
    docs = load(path)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policies, f"{os.path.basename(path)} has no NetworkPolicy"
    for hostname, _, template, kind, index, _ in pods(docs):
        labels = template["metadata"]["labels"]
        covering = [p for p in policies if selects(p["spec"]["podSelector"]["matchLabels"], labels)]
        assert covering, f"no NetworkPolicy selects the pods of {hostname or kind}"
        ports = {p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}
        for policy in covering:
            assert policy["spec"]["policyTypes"] == ["Ingress"]
            admitted = set()
            for rule in policy["spec"]["ingress"]:
                for peer in rule["from"]:
                    assert set(peer) == {"podSelector"}, f"{policy['metadata']['name']} admits {peer}: not a pod of the job"
                    own = selects(peer["podSelector"]["matchLabels"], labels)
                    client = list(peer["podSelector"]["matchLabels"]) == ["ttf-online-client"]
                    assert own or client, f"{policy['metadata']['name']} admits pods outside the job: {peer}"
                admitted |= {p["port"] for p in rule["ports"]}
            assert ports <= admitted, f"{hostname or kind} listens on {ports - admitted}, which the policy does not admit"


def test_kubernetes_validate_needs_no_network():
    """Its schemas ship in the package: validation works in a network namespace with no interface."""
    code = ("import sys, yaml, kubernetes_validate as kv\n"
            "for doc in yaml.safe_load_all(open(sys.argv[1])):\n"
            "    kv.validate(doc, '1.37', strict=True)\n"
            "print('validated offline')\n")
    try:
        proc = subprocess.run(["unshare", "-n", sys.executable, "-c", code, os.path.join(ROOT, "deploy", "kubernetes", "ps-job.yaml")],
                              capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        pytest.skip("no unshare here")
    if proc.returncode != 0 and "unshare failed" in proc.stderr:
        pytest.skip(f"network namespaces are not permitted here ({proc.stderr.strip()})")
    assert proc.returncode == 0 and "validated offline" in proc.stdout, proc.stderr[-2000:]

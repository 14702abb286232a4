#!/usr/bin/env python3
"""Offline check of deploy/k8s/*.yaml (docs/scale-out.md, "Kubernetes").

Debian's kubectl needs an API server even for a dry run, so this parses the manifests with
PyYAML and checks the fields they use: kinds, Indexed Job counts and the part index expression,
that every mount names a volume and every path a command uses lies on a mount, that the keys and
trust files the commands read are installed from a Secret or ConfigMap with a mode ckpt-audit
accepts, that every ckpt-audit subcommand and flag exists in the built binaries' --help, and that
each parts Job has a merge Job reading what it writes from the same claim. Mutated copies of the
manifests must each be refused with the expected reason.

The admission policies under deploy/admission (docs/interop.md, "Admission controllers") are
checked against what the code emits: a real `ckpt-audit audit --vsa` of the fixture model makes a
verification summary, every predicate field the Kyverno conditions and the policy-controller CUE
lines compare must exist in it, and the passing summary must satisfy both while a failed, foreign
or retyped one satisfies neither.

  k8s_manifests_test.py MANIFEST_DIR CKPT_AUDIT CKPT_AUDITD ADMISSION_DIR TEST_DATA
"""

import base64
import copy
import fnmatch
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import unittest

import yaml

KNOWN_KINDS = {
    ("v1", "PersistentVolumeClaim"), ("v1", "Service"), ("v1", "ConfigMap"),
    ("apps/v1", "Deployment"), ("batch/v1", "Job"), ("networking.k8s.io/v1", "NetworkPolicy"),
}
PART_EXPRESSION = "$JOB_COMPLETION_INDEX/$PARTS"
SHELL_OPERATORS = {"&&", "||", ";", "|", "&"}
WRITE_FLAGS = {"--out", "--db", "--vsa"}
# Files ckpt-audit reads as secrets (mode & 077 must be 0) or as trust files (no group/other
# write); docs/daemon.md "Small files".
SECRET_FLAGS = {"--key", "--part-key", "--tls-key", "--tokens"}
TRUST_FLAGS = {"--part-trust", "--trust"}


class Cli:
    """Subcommands and options of a CLI11 binary, read from its --help."""

    def __init__(self, binary):
        self.binary = binary
        self._help = {}

    def help(self, words):
        key = tuple(words)
        if key not in self._help:
            run = subprocess.run([self.binary, *words, "--help"], capture_output=True, text=True)
            self._help[key] = run.stdout if run.returncode == 0 else None
        return self._help[key]

    @staticmethod
    def subcommands(text):
        section = text.split("Subcommands:", 1)
        if len(section) < 2:
            return set()
        return {m.group(1) for m in re.finditer(r"^  (\S+)", section[1], re.M)}

    @staticmethod
    def options(text):
        """{name: values} for every option of a help text: 0 (a flag), 1, or 2 (one or more)."""
        found = {}
        for line in text.split("Options:", 1)[-1].splitlines():
            if not line.startswith("  -"):
                continue
            column = re.split(r"\s{2,}", line.strip())[0].split(" ")
            values = 0
            if len(column) > 1 and re.match(r"[A-Z]", column[1]):
                values = 2 if column[2:3] == ["..."] else 1
            for name in column[0].split(","):
                found[name] = values
        return found


def shell_commands(script):
    """Simple commands of a shell script: lists of words, with redirect targets under '>'."""
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, current = [], []
    for token in lexer:
        if token in SHELL_OPERATORS:
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    return [c for c in commands if c]


def under(path, mount):
    return path == mount or path.startswith(mount.rstrip("/") + "/")


class Checker:
    def __init__(self, audit_cli, auditd_cli):
        self.clis = {"ckpt-audit": audit_cli, "ckpt-auditd": auditd_cli}
        self.errors = []

    def error(self, where, message):
        self.errors.append(f"{where}: {message}")

    # ---- one ckpt-audit or ckpt-auditd invocation -------------------------------------------
    def invocation(self, where, program, words):
        """Checks subcommand and flags; returns [(flag or None, value)] for its arguments."""
        cli = self.clis[program]
        path = []
        text = cli.help(path)
        while words and not words[0].startswith("-") and words[0] in Cli.subcommands(text):
            path.append(words.pop(0))
            text = cli.help(path)
        if program == "ckpt-audit" and not path:
            self.error(where, f"ckpt-audit without a known subcommand: {words[:1]}")
            return []
        options = Cli.options(text)
        arguments, flag, values = [], None, 0
        for word in words:
            if word.startswith("--"):
                name, _, inline = word.partition("=")
                if name not in options:
                    self.error(where, f"{' '.join([program, *path])}: no option {name}")
                flag, values = name, options.get(name, 0)
                if inline:
                    arguments.append((name, inline))
                    values = 0
                continue
            arguments.append((flag if values else None, word))
            values = 2 if values == 2 else 0
        return arguments

    # ---- one pod template --------------------------------------------------------------------
    def pod(self, where, spec, env_allowed):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        containers = spec.get("initContainers", []) + spec["containers"]
        mounted = set()
        installed = {}  # (volume, path in it) -> (mode, source volume)
        result = {"reads": [], "writes": [], "merge_inputs": [], "trees": [], "mounts": []}
        for container in containers:
            cwhere = f"{where} container {container['name']}"
            mounts = container.get("volumeMounts", [])
            for m in mounts:
                if m["name"] not in volumes:
                    self.error(cwhere, f"mount {m['mountPath']} names no volume {m['name']}")
                mounted.add(m["name"])
                if container in spec["containers"]:
                    result["mounts"].append((m["mountPath"], claim(volumes.get(m["name"], {}))))

            def mount_of(p, mounts=mounts):
                best = [m for m in mounts if under(p, m["mountPath"])]
                return max(best, key=lambda m: len(m["mountPath"])) if best else None

            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            command = container.get("command")
            args = container.get("args", [])
            if command is None:  # the image's entrypoint: ckpt-auditd (deploy/Dockerfile)
                commands = [["ckpt-auditd", *args]] if args else []
            elif command[:2] == ["sh", "-c"]:
                script = (command[2:] + args + [""])[0]  # further words are $0, $1, ...
                for name in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", script):
                    if name not in env and name not in env_allowed:
                        self.error(cwhere, f"${name} is neither in env nor set by Kubernetes")
                commands = shell_commands(script)
            else:
                commands = [command + args]
            for words in commands:
                self.command(cwhere, words, mount_of, volumes, installed, result, env)
        for name in volumes:
            if name not in mounted:
                self.error(where, f"volume {name} is mounted by no container")
        for flag, p, mount in result["reads"]:
            if mount["name"] in volumes:
                self.provenance(where, flag, p, volumes[mount["name"]],
                                installed.get(in_volume(p, mount)))
        return result

    def command(self, where, words, mount_of, volumes, installed, result, env):
        redirects = []
        plain = []
        it = iter(words)
        for w in it:
            if w in (">", ">>"):
                redirects.append(next(it, ""))
            else:
                plain.append(w)
        if not plain:
            return
        program = plain[0]
        if program == "install":
            mode, rest = "0755", plain[1:]
            if rest[:1] == ["-m"]:
                mode, rest = rest[1], rest[2:]
            if len(rest) == 2:
                source, dest = rest
                smount = mount_of(source)
                dmount = mount_of(dest)
                if smount is None or dmount is None:
                    self.error(where, f"install {source} {dest}: not both on mounts")
                else:
                    installed[in_volume(dest, dmount)] = (int(mode, 8),
                                                          volumes.get(smount["name"], {}))
            return
        writes = list(redirects)
        if program == "mv" and len(plain) == 3:
            writes.append(plain[2])
        arguments = []
        if program in self.clis:
            arguments = self.invocation(where, program, plain[1:])
            for flag, value in arguments:
                mount = mount_of(value)
                if flag in (None, "--source") and mount is not None:
                    result["trees"].append((value, claim(volumes.get(mount["name"], {}))))
                if flag == "--part" and value != PART_EXPRESSION:
                    self.error(where, f"--part {value}: expected {PART_EXPRESSION}")
                if flag == "--part" and env.get("PARTS") is None:
                    self.error(where, "--part without a PARTS env value")
                if flag in WRITE_FLAGS:
                    writes.append(value)
                if flag == "--merge" and mount is not None:
                    result["merge_inputs"].append((value, volumes.get(mount["name"], {})))
                if flag in SECRET_FLAGS | TRUST_FLAGS and mount is not None:
                    result["reads"].append((flag, value, mount))
        for value in [w for w in plain[1:] if w.startswith("/")] + writes:
            if mount_of(value) is None:
                self.error(where, f"{value} lies on no volume mount")
        for value in writes:
            mount = mount_of(value)
            if mount is not None and mount.get("readOnly"):
                self.error(where, f"{value} is written but {mount['mountPath']} is read-only")
            if mount is not None:
                result["writes"].append((value, volumes.get(mount["name"], {})))

    def provenance(self, where, flag, path, volume, installed):
        """A key or trust file comes from a Secret or ConfigMap, with a mode ckpt-audit accepts."""
        if "secret" in volume or "configMap" in volume:
            mode = volume.get("secret", volume.get("configMap", {})).get("defaultMode", 0o644)
        elif installed is not None:
            mode, source = installed
            if "secret" not in source and "configMap" not in source:
                self.error(where, f"{flag} {path} is installed from neither a Secret nor a "
                           "ConfigMap")
                return
        else:
            self.error(where, f"{flag} {path}: nothing installs it from a Secret or ConfigMap")
            return
        forbidden = 0o077 if flag in SECRET_FLAGS else 0o022
        if mode & forbidden:
            self.error(where, f"{flag} {path} has mode {mode:04o}; ckpt-audit refuses it")

    # ---- documents ----------------------------------------------------------------------------
    def document(self, where, doc):
        api, kind = doc.get("apiVersion"), doc.get("kind")
        if (api, kind) not in KNOWN_KINDS:
            self.error(where, f"unexpected apiVersion/kind {api}/{kind}")
            return None
        if not doc.get("metadata", {}).get("name"):
            self.error(where, "metadata.name is missing")
        where = f"{where} {kind} {doc['metadata'].get('name')}"
        if kind not in ("Deployment", "Job"):
            return None
        spec = doc["spec"]
        pod = spec["template"]["spec"]
        env_allowed = set()
        if kind == "Job":
            if pod.get("restartPolicy") not in ("Never", "OnFailure"):
                self.error(where, "a Job's restartPolicy must be Never or OnFailure")
            if spec.get("completionMode") == "Indexed":
                env_allowed.add("JOB_COMPLETION_INDEX")
                n = spec.get("completions")
                if n != spec.get("parallelism"):
                    self.error(where, f"completions {n} != parallelism {spec.get('parallelism')}")
                for c in pod["containers"]:
                    parts = {e["name"]: e.get("value") for e in c.get("env", [])}.get("PARTS")
                    if parts is not None and parts != str(n):
                        self.error(where, f"PARTS {parts} != completions {n}")
        result = self.pod(where, pod, env_allowed)
        result.update(where=where, indexed=bool(env_allowed))
        return result

    def check(self, files):
        """files: {name: [documents]}; returns the list of errors."""
        self.errors = []
        jobs = []
        for name, docs in sorted(files.items()):
            for i, doc in enumerate(docs):
                if doc is None:
                    continue
                job = self.document(f"{name}[{i}]", doc)
                if job is not None and "Job " in job["where"]:
                    jobs.append(job)
        for job in [j for j in jobs if j["indexed"]]:
            finals = [(p.replace("$JOB_COMPLETION_INDEX", "0"), v) for p, v in job["writes"]]
            merges = [m for m in jobs if any(
                fnmatch.fnmatch(p, pattern) and claim(v) and claim(v) == claim(mv)
                for pattern, mv in m["merge_inputs"] for p, v in finals)]
            if not merges:
                self.error(job["where"], "no merge Job reads its parts from the same claim")
            # The merge opens the trees again at the paths the parts used.
            for merge in merges:
                for tree, tree_claim in job["trees"]:
                    at = [(mp, c) for mp, c in merge["mounts"] if under(tree, mp)]
                    if not at or max(at, key=lambda m: len(m[0]))[1] != tree_claim:
                        self.error(merge["where"], f"does not mount {tree} from claim "
                                   f"{tree_claim} as the parts do")
        return self.errors


def in_volume(path, mount):
    return mount["name"], path[len(mount["mountPath"].rstrip("/")):]


def claim(volume):
    return volume.get("persistentVolumeClaim", {}).get("claimName")


def load(directory):
    files = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.yaml"))):
        with open(path) as f:
            files[os.path.basename(path)] = list(yaml.safe_load_all(f))
    return files


class ManifestTest(unittest.TestCase):
    def setUp(self):
        self.files = load(MANIFESTS)
        self.checker = Checker(Cli(CKPT_AUDIT), Cli(CKPT_AUDITD))

    def test_every_manifest_is_consistent(self):
        self.assertGreaterEqual(len(self.files), 5, sorted(self.files))
        self.assertEqual(self.checker.check(self.files), [])

    def containers(self, name, init=False):
        pod = self.files[name][0]["spec"]["template"]["spec"]
        return pod["initContainers" if init else "containers"]

    def named(self, items, name):
        return next(i for i in items if i["name"] == name)

    def script(self, name, edit):
        c = self.containers(name)[0]
        c["args"] = [edit(c["args"][0])]

    def test_mutations_are_refused(self):
        parts, merge = "audit-parts-job.yaml", "audit-merge-job.yaml"
        spec = lambda name: self.files[name][0]["spec"]  # noqa: E731
        pod = lambda name: spec(name)["template"]["spec"]  # noqa: E731
        mutations = {
            "completions 7 != parallelism 8": lambda: spec(parts).update(completions=7),
            "PARTS 4 != completions 8": lambda: self.containers(parts)[0]["env"][0].update(
                value="4"),
            "--part 0/$PARTS: expected": lambda: self.script(
                parts, lambda s: s.replace('"$JOB_COMPLETION_INDEX/$PARTS"', "0/$PARTS")),
            "names no volume": lambda: pod(parts)["volumes"].remove(
                self.named(pod(parts)["volumes"], "parts")),
            "mounted by no container": lambda: self.containers(merge)[0]["volumeMounts"].remove(
                self.named(self.containers(merge)[0]["volumeMounts"], "evidence")),
            "no option --parts": lambda: self.script(
                parts, lambda s: s.replace("--part ", "--parts ")),
            "no option --part-trusted": lambda: self.script(
                merge, lambda s: s.replace("--part-trust", "--part-trusted")),
            "without a known subcommand": lambda: self.script(
                merge, lambda s: s.replace("ckpt-audit audit", "ckpt-audit audits")),
            "lies on no volume mount": lambda: self.script(
                parts, lambda s: s.replace("/models/kimi-k3-mxfp4", "/data/kimi-k3-mxfp4")),
            "is read-only": lambda: self.named(
                self.containers(merge)[0]["volumeMounts"], "parts").update(readOnly=True),
            "nothing installs it": lambda: self.containers(merge, init=True)[0].update(
                args=["install -m 0600 /secret/key/signing.pem /etc/ckpt-audit/signing.pem"]),
            "mode 0644; ckpt-audit refuses": lambda: self.containers(parts, init=True)[0].update(
                command=["install", "-m", "0644", "/secret/node-key/node.pem",
                         "/etc/ckpt-audit/node.pem"]),
            "$JOB_COMPLETION_INDEX is neither": lambda: spec(parts).pop("completionMode"),
            "no merge Job reads its parts": lambda: self.named(pod(merge)["volumes"], "parts")
            .update(persistentVolumeClaim={"claimName": "elsewhere"}),
            "does not mount /models/kimi-k3-mxfp4": lambda: self.containers(merge)[0][
                "volumeMounts"].remove(self.named(self.containers(merge)[0]["volumeMounts"],
                                                  "models")),
            "unexpected apiVersion/kind": lambda: self.files[merge][0].update(
                apiVersion="batch/v2"),
        }
        pristine = copy.deepcopy(self.files)
        for expected, mutate in mutations.items():
            with self.subTest(expected):
                self.files = copy.deepcopy(pristine)
                mutate()
                errors = self.checker.check(self.files)
                self.assertTrue(any(expected in e for e in errors), errors)


VSA_TYPE = "https://slsa.dev/verification_summary/v1"
ADMISSION_KINDS = {("kyverno.io/v1", "ClusterPolicy"),
                   ("policy.sigstore.dev/v1beta1", "ClusterImagePolicy")}


def lookup(statement, path):
    """The value at a dotted path ("predicate.verifier.id"), or KeyError."""
    value = statement
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(path)
        value = value[part]
    return value


def kyverno_constraints(doc):
    """(predicateType, public keys, [(path, allowed values)]) of a ClusterPolicy's attestations."""
    out = []
    for rule in doc["spec"]["rules"]:
        for verify in rule.get("verifyImages", []):
            for att in verify.get("attestations", []):
                keys = [e["keys"]["publicKeys"] for a in att["attestors"] for e in a["entries"]]
                conditions = []
                for block in att.get("conditions", []):
                    for cond in block["all"]:
                        m = re.fullmatch(r"\{\{\s*(\S+)\s*\}\}", cond["key"])
                        if not m or cond["operator"] not in ("Equals", "AnyIn"):
                            raise ValueError(f"unsupported condition {cond}")
                        value = cond["value"]
                        conditions.append((m.group(1), value if isinstance(value, list)
                                           else [value]))
                out.append((att["type"], keys, conditions))
    return out


def cue_constraints(text):
    """[(path, allowed values)] of CUE lines `a: b: "x" | "y"` (one constraint a line)."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = re.fullmatch(r'((?:[A-Za-z_]+: )+)("[^"]*"(?: \| "[^"]*")*)', line.strip())
        if not m:
            raise ValueError(f"not a one-line CUE constraint: {line}")
        path = ".".join(p.strip() for p in m.group(1).split(":") if p.strip())
        out.append((path, re.findall(r'"([^"]*)"', m.group(2))))
    return out


def policy_controller_constraints(doc):
    out = []
    for authority in doc["spec"]["authorities"]:
        for att in authority.get("attestations", []):
            if att["policy"]["type"] != "cue":
                raise ValueError("only cue policies are checked")
            out.append((att["predicateType"], [authority["key"]["data"]],
                        cue_constraints(att["policy"]["data"])))
    return out


def constraints_of(doc):
    if doc.get("kind") == "ClusterPolicy":
        return kyverno_constraints(doc)
    return policy_controller_constraints(doc)


def admits(doc, statement):
    """Whether the policy's attestation checks accept this in-toto statement (signature aside)."""
    for predicate_type, _, conditions in constraints_of(doc):
        if statement.get("predicateType") != predicate_type:
            return False
        for path, allowed in conditions:
            if not path.startswith("predicate") and not path.startswith("predicateType"):
                path = "predicate." + path
            try:
                value = lookup(statement, path)
            except KeyError:
                return False
            values = value if isinstance(value, list) else [value]
            if not any(v in allowed for v in values):
                return False
    return True


def check_admission(files, statement):
    """Errors: unknown kinds, a predicate type or field ckpt-audit does not emit, key trouble."""
    errors = []
    keys = set()
    for path, docs in files.items():
        for doc in docs:
            where = os.path.basename(path)
            if (doc.get("apiVersion"), doc.get("kind")) not in ADMISSION_KINDS:
                errors.append(f"{where}: unexpected apiVersion/kind")
                continue
            try:
                constraints = constraints_of(doc)
            except (KeyError, ValueError) as e:
                errors.append(f"{where}: cannot read its attestation checks: {e}")
                continue
            if not constraints:
                errors.append(f"{where}: checks no attestation")
            for predicate_type, pems, conditions in constraints:
                if predicate_type != statement["predicateType"]:
                    errors.append(f"{where}: predicate type {predicate_type} is not the "
                                  f"{statement['predicateType']} ckpt-audit emits")
                for path, _ in conditions:
                    full = path if path.startswith("predicate") else "predicate." + path
                    try:
                        lookup(statement, full)
                    except KeyError:
                        errors.append(f"{where}: {full} is not a field ckpt-audit emits")
                for pem in pems:
                    keys.add(pem.strip())
                    run = subprocess.run(["openssl", "pkey", "-pubin", "-noout"], input=pem,
                                         text=True, capture_output=True)
                    if run.returncode != 0:
                        errors.append(f"{where}: the public key is not a PEM public key")
    if len(keys) > 1:
        errors.append("the admission policies trust different keys")
    return errors


class AdmissionTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        work = cls.tmp.name
        env = dict(os.environ, XDG_DATA_HOME=f"{work}/xdg", XDG_STATE_HOME=f"{work}/state")
        run = lambda *args: subprocess.run([CKPT_AUDIT, *args], env=env, capture_output=True,
                                           text=True, check=True)
        run("keys", "generate", "--out", f"{work}/key.pem", "--trust", f"{work}/trusted")
        run("audit", os.path.join(TEST_DATA, "mini-kimi-mxfp4"), "--db", f"{work}/log.db",
            "--key", f"{work}/key.pem", "--vsa", f"{work}/vsa.json")
        with open(f"{work}/vsa.json") as f:
            envelope = json.load(f)
        cls.statement = json.loads(base64.b64decode(envelope["payload"]))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):
        self.files = load(ADMISSION)
        self.assertEqual(len(self.files), 2, sorted(self.files))

    def test_policies_match_what_ckpt_audit_emits(self):
        self.assertEqual(self.statement["predicateType"], VSA_TYPE)
        self.assertEqual(self.statement["predicate"]["verificationResult"], "PASSED")
        self.assertEqual(check_admission(self.files, self.statement), [])
        for path, docs in self.files.items():
            with self.subTest(os.path.basename(path)):
                self.assertTrue(admits(docs[0], self.statement))

    def test_failed_foreign_or_retyped_summaries_are_not_admitted(self):
        edits = {
            "failed": lambda s: s["predicate"].update(verificationResult="FAILED"),
            "another verifier": lambda s: s["predicate"]["verifier"].update(
                id="https://example.com/other-verifier"),
            "another predicate type": lambda s: s.update(
                predicateType="https://slsa.dev/provenance/v1"),
        }
        for name, edit in edits.items():
            statement = copy.deepcopy(self.statement)
            edit(statement)
            for path, docs in self.files.items():
                with self.subTest(f"{name}: {os.path.basename(path)}"):
                    self.assertFalse(admits(docs[0], statement))

    def test_policy_mutations_are_refused(self):
        kyverno = next(p for p in self.files if "kyverno" in p)
        pc = next(p for p in self.files if "policy-controller" in p)
        att = lambda: self.files[kyverno][0]["spec"]["rules"][0]["verifyImages"][0][
            "attestations"][0]
        pc_att = lambda: self.files[pc][0]["spec"]["authorities"][0]["attestations"][0]
        mutations = {
            "is not a field ckpt-audit emits": lambda: att()["conditions"][0]["all"][0].update(
                key="{{ predicate.result }}"),
            "is not the https://slsa.dev/verification_summary/v1": lambda: att().update(
                type="https://slsa.dev/verification_summary/v0.2"),
            "predicate.verifier.name is not a field": lambda: pc_att()["policy"].update(
                data='predicate: verifier: name: "ckpt-audit"\n'),
            "not a PEM public key": lambda: self.files[pc][0]["spec"]["authorities"][0][
                "key"].update(data="-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"),
            "unexpected apiVersion/kind": lambda: self.files[pc][0].update(
                apiVersion="policy.sigstore.dev/v1alpha9"),
        }
        pristine = copy.deepcopy(self.files)
        for expected, mutate in mutations.items():
            with self.subTest(expected):
                self.files = copy.deepcopy(pristine)
                mutate()
                errors = check_admission(self.files, self.statement)
                self.assertTrue(any(expected in e for e in errors), errors)


if __name__ == "__main__":
    MANIFESTS, CKPT_AUDIT, CKPT_AUDITD, ADMISSION, TEST_DATA = sys.argv[1:6]
    unittest.main(argv=sys.argv[:1] + sys.argv[6:], verbosity=2)

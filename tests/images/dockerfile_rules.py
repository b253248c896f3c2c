"""A small Dockerfile reader and the rules every runtime image must follow.

`violations(text)` returns human-readable rule breaks (empty when the file is fine), so the
test can show all of them at once and can be checked against deliberately broken files.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

_ARG_REF = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
_NUMERIC_USER = re.compile(r"^(\d+)(:(\d+))?$")
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


@dataclass
class Instruction:
    keyword: str
    value: str
    line: int


@dataclass
class Stage:
    image: str  # as written, ARGs resolved
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]
    comments: list[str]

    def args(self) -> dict[str, str]:
        """Every ARG with a default, global or in a stage."""
        found = dict(self.global_args)
        for stage in self.stages:
            for ins in stage.instructions:
                if ins.keyword == "ARG" and "=" in ins.value:
                    name, _, default = ins.value.partition("=")
                    found.setdefault(name.strip(), default.strip().strip('"'))
        return found


def inherited(dockerfile: Dockerfile, stage: Stage) -> list[Instruction]:
    """The stage's instructions after those of the stages it is built FROM (USER, HEALTHCHECK,
    ENTRYPOINT and CMD carry over from a parent stage)."""
    by_name = {s.name: s for s in dockerfile.stages if s.name}
    chain = [stage]
    while chain[-1].image in by_name and by_name[chain[-1].image] not in chain:
        chain.append(by_name[chain[-1].image])
    return [ins for ancestor in reversed(chain) for ins in ancestor.instructions]


def parse(text: str) -> Dockerfile:
    """Logical instructions (continuations joined, comments kept apart), grouped by stage."""
    logical: list[tuple[str, int]] = []
    comments: list[str] = []
    buffer, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#"):
            comments.append(stripped)
            continue
        if not stripped and not buffer:
            continue
        if not buffer:
            start = number
        if stripped.endswith("\\"):
            buffer += stripped[:-1] + " "
            continue
        buffer += stripped
        logical.append((buffer, start))
        buffer = ""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line, number in logical:
        keyword, _, value = line.partition(" ")
        keyword, value = keyword.upper(), value.strip()
        if keyword == "FROM":
            words = [w for w in value.split() if not w.startswith("--")]
            image = _ARG_REF.sub(lambda m: global_args.get(m.group(1), m.group(0)), words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(image=image, name=name))
        elif not stages:
            if keyword == "ARG":
                name, _, default = value.partition("=")
                global_args[name.strip()] = default.strip().strip('"')
        else:
            stages[-1].instructions.append(Instruction(keyword, value, number))
    return Dockerfile(global_args, stages, comments)


def exec_form(value: str) -> list[str] | None:
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    if isinstance(parsed, list) and parsed and all(isinstance(a, str) for a in parsed):
        return parsed
    return None


def _healthcheck_command(value: str) -> str:
    words = value.split()
    while words and words[0].startswith("--"):
        words.pop(0)
    if not words or words[0].upper() != "CMD":
        return ""
    return value[value.upper().index("CMD") + 3:].strip()


def violations(text: str) -> list[str]:
    dockerfile = parse(text)
    problems: list[str] = []
    stages = dockerfile.stages
    if len(stages) < 2:
        problems.append("not multi-stage (needs a build or base stage and a runtime stage)")
    stage_names = {s.name for s in stages if s.name}
    pinned_by_tag_only = False
    for stage in stages:
        image = stage.image
        if image in stage_names:
            continue
        if "$" in image:
            problems.append(f"FROM {image}: an ARG without a default")
            continue
        reference = image.split("@")[0]
        tag = reference.rsplit(":", 1)[1] if ":" in reference.rsplit("/", 1)[-1] else None
        if tag is None:
            problems.append(f"FROM {image}: no tag")
        elif tag == "latest":
            problems.append(f"FROM {image}: uses latest")
        if "@" in image and not _DIGEST.search(image):
            problems.append(f"FROM {image}: malformed digest")
        if "@" not in image:
            pinned_by_tag_only = True
    if pinned_by_tag_only and not any("digest" in c.lower() for c in dockerfile.comments):
        problems.append("bases pinned by tag only, without a comment saying why no digest")
    if re.search(r":latest\b", text):
        problems.append("mentions a :latest image")
    if not stages:
        return [*problems, "no FROM"]
    final = inherited(dockerfile, stages[-1])
    users = [i for i in final if i.keyword == "USER"]
    if not users:
        problems.append("final stage has no USER (runs as root)")
    else:
        match = _NUMERIC_USER.match(users[-1].value)
        if not match:
            problems.append(f"USER {users[-1].value}: not a numeric uid[:gid]")
        elif int(match.group(1)) == 0:
            problems.append("USER 0: root")
    healthchecks = [i for i in final if i.keyword == "HEALTHCHECK"]
    if not healthchecks:
        problems.append("final stage has no HEALTHCHECK")
    for check in healthchecks:
        if exec_form(_healthcheck_command(check.value)) is None:
            problems.append(f"HEALTHCHECK {check.value}: not CMD with an exec-form JSON array")
    for stage in stages:
        for ins in stage.instructions:
            if ins.keyword in ("CMD", "ENTRYPOINT") and exec_form(ins.value) is None:
                problems.append(f"line {ins.line}: {ins.keyword} {ins.value}: not exec form")
    if not any(i.keyword == "ENTRYPOINT" for i in final):
        problems.append("final stage has no ENTRYPOINT")
    return problems


def cmake_configure_flags(text: str) -> list[list[str]]:
    """The -D flags of each `cmake -S ...` configure command, in order (quotes removed)."""
    found = []
    for stage in parse(text).stages:
        for ins in stage.instructions:
            if ins.keyword != "RUN":
                continue
            for command in re.split(r"&&|;", ins.value):
                words = command.split()
                if words[:2] == ["cmake", "-S"]:
                    found.append([w.strip('"') for w in words if w.strip('"').startswith("-D")])
    return found

"""`invoke new-tenant`: render cookiecutters/tenant into inventories/<org>, validated before it lands.

Every option is checked first; the tenant is rendered into a staging folder beside the target, validated
there, and only then moved into place (one rename), so a refused option leaves nothing behind. With
--force an existing tenant is moved to `<inventories>/.backup/<org>-<time>/` first (its spec edits and its
acceptance history survive) and its `generated/` folder (stack outputs, acceptance history) is carried
over to the new spec.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import unicodedata
from pathlib import Path

from cookiecutter.exceptions import CookiecutterException
from cookiecutter.main import cookiecutter

from fmcluster.model import Tenant, TenantInvalid, load_spec
from fmcluster.paths import inventories_dir, real_dir, repo_root
from fmcluster.validation import REFUSED_CATEGORIES, Problem, did_you_mean, org_problem, show

BACKUP_DIR = ".backup"

#: Spec key each answer lands in → the command-line option a person typed it as.
OPTION_OF = {
    "tenant.org": "--org",
    "tenant.queues[0].instance_type": "--instance-type",
    "tenant.queues[0].count": "--count",
    "tenant.scheduler": "--scheduler",
    "tenant.region": "--region",
    "tenant.availability_zone": "--region",
    "tenant.provider": "--provider",
}
#: Answers rendered as YAML numbers: digits only (anything else is rendered as text and refused by the schema).
NUMERIC_ANSWERS = ("count", "lustre_capacity_gib")


class TenantExists(Exception):
    pass


class NewTenantInvalid(ValueError):
    """An option cannot make a valid tenant; nothing was written."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__("\n".join(p.render() for p in problems) + f"\n{len(problems)} {noun}; nothing was written.")


def template_dir(root: Path | None = None) -> Path:
    return (root or repo_root()) / "cookiecutters" / "tenant"


def template_problem(root: Path | None = None) -> Problem | None:
    """A problem when the checkout has no usable tenant template (cookiecutters/tenant/cookiecutter.json, a JSON
    object): `invoke new-tenant` run outside an fmcluster checkout, or with FMCLUSTER_ROOT at a tree of tenants
    only."""
    where = template_dir(root) / "cookiecutter.json"
    fix = ("run it in an fmcluster checkout, or point FMCLUSTER_ROOT at one (the folder holding cookiecutters/tenant/); "
           f"now: {show(str(root or repo_root()))}")
    try:
        context = json.loads(where.read_text(encoding="utf-8")) if where.is_file() else None
    except (OSError, UnicodeDecodeError, ValueError):
        return Problem(Path("cookiecutters/tenant/cookiecutter.json"), None, "", "the tenant template cannot be read "
                       "(not UTF-8 JSON)", fix)
    if not isinstance(context, dict):
        return Problem(Path("cookiecutters/tenant/cookiecutter.json"), None, "",
                       "there is no tenant template here" if context is None else "the tenant template is not a "
                       "JSON object", fix)
    return None


def _option(answer: str) -> str:
    # The task derives the availability zone from --region (`<region>a`).
    return "--region" if answer == "availability_zone" else "--" + answer.replace("_", "-")


def _registered() -> dict[str, list[str]]:
    """The answers whose choices are the registries' (a provider or scheduler is a folder plus a registry line)."""
    from fmcluster.capabilities import PROVIDERS, SCHEDULERS

    return {"provider": list(PROVIDERS), "scheduler": list(SCHEDULERS)}


def _context(root: Path | None = None) -> dict[str, object]:
    """The template's cookiecutter.json with each registered answer a choice among the registry's names, the
    template's own default first."""
    context: dict[str, object] = json.loads((template_dir(root) / "cookiecutter.json").read_text(encoding="utf-8"))
    for key, names in _registered().items():
        default = context.get(key)
        context[key] = ([default] if default in names else []) + [n for n in names if n != default]
    return context


def _choices(root: Path | None = None) -> dict[str, list[str]]:
    return {k: [str(c) for c in v] for k, v in _context(root).items() if isinstance(v, list)}


def _staged_template(staging: Path) -> Path:
    """The tenant template, copied with the registries' choices written into its cookiecutter.json."""
    template = staging / ".template" / "tenant"
    shutil.copytree(template_dir(), template)
    (template / "cookiecutter.json").write_text(json.dumps(_context(), indent=2) + "\n", encoding="utf-8")
    return template


def answer_problems(answers: dict[str, str]) -> list[Problem]:
    """What no answer may hold before cookiecutter sees it: cookiecutter renders answers as Jinja templates,
    so braces are refused outright, with control characters and oversized values."""
    problems = []
    choices = _choices()
    for key, value in answers.items():
        where = Path(_option(key))
        if not isinstance(value, str):
            problems.append(Problem(where, None, "", f"{show(value)} is not text", "pass the option as text"))
        elif len(value) > 256:
            problems.append(Problem(where, None, "", f"the value is {len(value)} characters long",
                                    "no option needs more than 256 characters"))
        elif any(unicodedata.category(c) in REFUSED_CATEGORIES for c in value):
            problems.append(Problem(where, None, "", f"{show(value)} contains a control character",
                                    "pass a single line of printable characters"))
        elif "{" in value or "}" in value:
            problems.append(Problem(where, None, "", f"{show(value)} contains template syntax",
                                    "values are data: remove '{' and '}'"))
        elif key == "org" and (bad := org_problem(value)):
            problems.append(Problem(where, None, "", *bad))
        elif key in NUMERIC_ANSWERS and not (value.isascii() and value.isdigit()):
            problems.append(Problem(where, None, "", f"{show(value)} is not a count",
                                    f"pass {_option(key)}=N with N a whole number of at least 1, e.g. {_option(key)}=2"))
        elif key in choices and value not in choices[key]:
            problems.append(Problem(where, None, "", f"{show(value)} is not offered{did_you_mean(value, choices[key])}",
                                    f"use one of: {', '.join(choices[key])}"))
    return problems


def _as_options(err: TenantInvalid, answers: dict[str, str]) -> list[Problem]:
    """The staged spec's problems, named by the option that caused them (the staged file is gone by then)."""
    out = []
    for p in err.problems:
        option = OPTION_OF.get(p.key)
        if option is not None:
            given = answers.get(option.removeprefix("--").replace("-", "_"))
            shown = f"{option}={given}" if given is not None else option
            out.append(Problem(Path(shown), None, "", p.message, p.fix))
        else:
            out.append(Problem(Path("cookiecutters/tenant"), None, p.key, p.message, p.fix))
    return out


def _backup(existing: Path, target_root: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    # A real folder: a `.backup -> elsewhere` link would carry the old tenant (its spec edits) out of the tree.
    folder = real_dir(target_root / BACKUP_DIR, target_root)
    backup = folder / f"{existing.name}-{stamp}"
    n = 1
    while backup.exists():
        n += 1
        backup = folder / f"{existing.name}-{stamp}-{n}"
    return backup


def new_tenant(
    org: str | None,
    answers: dict[str, str],
    *,
    interactive: bool = False,
    force: bool = False,
    output_dir: Path | None = None,
) -> Tenant:
    """Render a tenant and return it validated. Refuses to overwrite an existing tenant unless force; with
    force the existing one is kept under `.backup/`. Raises NewTenantInvalid (a ValueError) or TenantExists,
    having written nothing."""
    target_root = output_dir or inventories_dir()
    if bad_root := _output_dir_problem(target_root):
        raise NewTenantInvalid([bad_root])
    if org is not None:
        if bad := org_problem(org):
            raise NewTenantInvalid([Problem(Path("--org"), None, "", f"{bad[0]} (not a safe name)", bad[1])])
        answers = {"org": org, **answers}
    if missing := template_problem():
        raise NewTenantInvalid([missing])
    problems = answer_problems(answers)
    if problems:
        raise NewTenantInvalid(problems)
    if org is not None and (target_root / org).is_symlink():
        raise NewTenantInvalid([_linked_tenant(target_root / org)])
    if org is not None and (target_root / org).exists() and not force:
        raise TenantExists(f"{target_root / org} already exists; pass --force to replace it (the old one is kept "
                           f"under {target_root / BACKUP_DIR}/)")
    created_root = not target_root.exists()
    try:
        target_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".new-tenant-", dir=target_root))
    except OSError as err:
        raise NewTenantInvalid([Problem(Path("--output-dir"), None, "", f"{show(str(target_root))} cannot be written: "
                                        f"{show(err.strerror or str(err))}", "pass a directory you can write")]) from None
    try:
        try:
            rendered = Path(cookiecutter(
                str(_staged_template(staging)),
                no_input=not interactive,
                extra_context=answers,
                output_dir=str(staging),
                # Replay files and the template cache stay in the staging folder, which is removed below.
                default_config={"replay_dir": str(staging / ".replay"), "cookiecutters_dir": str(staging / ".cache")},
            ))
        except CookiecutterException as err:  # e.g. the template's pre_gen hook refusing a prompted org name
            raise NewTenantInvalid([Problem(Path("cookiecutters/tenant"), None, "",
                                            f"the scaffold refused the answers: {err}",
                                            "answer the prompts in the forms `invoke new-tenant --help` describes")]) from None
        name = rendered.name
        if bad := org_problem(name):
            raise NewTenantInvalid([Problem(Path("org"), None, "", *bad)])
        try:
            load_spec(rendered / "group_vars" / "all" / "tenant.yml")
        except TenantInvalid as err:
            raise NewTenantInvalid(_as_options(err, answers)) from None
        final = target_root / name
        if final.is_symlink():
            raise NewTenantInvalid([_linked_tenant(final)])
        if final.exists() and not force:
            raise TenantExists(f"{final} already exists; pass --force to replace it")
        _move_into_place(rendered, final, target_root)
        return load_spec(final / "group_vars" / "all" / "tenant.yml")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created_root and not any(target_root.iterdir()):
            target_root.rmdir()


def _output_dir_problem(target_root: Path) -> Problem | None:
    """Why the tenants' folder cannot take a new tenant (not a directory, a link loop, unreadable), or None."""
    where = Path("--output-dir")
    try:
        if target_root.exists() and not target_root.is_dir():
            return Problem(where, None, "", f"{show(str(target_root))} is not a directory",
                           "pass a directory (it is created when missing), e.g. --output-dir=inventories")
        target_root.resolve(strict=False)
    except (OSError, RuntimeError) as err:
        return Problem(where, None, "", f"{show(str(target_root))} cannot be used: {show(str(err))}",
                       "pass a directory you can write, without a symbolic-link loop")
    return None


def _linked_tenant(folder: Path) -> Problem:
    return Problem(folder, None, "", "is a symbolic link; a tenant is the folder it is named by, never a link",
                   f"remove the link (`rm {folder}`) or choose another --org")


def _move_into_place(rendered: Path, final: Path, target_root: Path) -> None:
    if not final.exists():
        rendered.rename(final)
        return
    backup = _backup(final, target_root)
    final.rename(backup)
    try:
        rendered.rename(final)
    except OSError:
        backup.rename(final)
        raise
    if (backup / "generated").is_dir() and not (backup / "generated").is_symlink():  # never copy a link's target
        shutil.copytree(backup / "generated", final / "generated", symlinks=True)

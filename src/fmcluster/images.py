"""The image catalog: what each image fmcluster's nodes boot ships, and what first boot adds (data/images.yml).

Which image a node gets is the scheduler's choice (`Scheduler.image`: by the instance's accelerator on
slurm-ec2, the service's own image on HyperPod and ParallelCluster); this module only reads the catalog and
says, for plan and the deploy summary, which image each node kind boots.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import yaml

from fmcluster.paths import DATA_DIR

if TYPE_CHECKING:
    from fmcluster.model import Tenant

IMAGES_PATH = DATA_DIR / "images.yml"
Source = Literal["ssm", "chosen", "built"]
COMPONENTS = ("python", "aws_cli", "nvidia_driver", "efa_installer", "neuron", "lustre_client", "slurm")
ACCELERATORS = ("cuda", "neuron", "none")


class ImageCatalogError(ValueError):
    """images.yml breaks one of its rules; the message names the file, the key and the fix."""


@dataclass(frozen=True)
class Component:
    present: bool
    version: str | None
    source: str


@dataclass(frozen=True)
class Image:
    key: str
    name: str
    os: str
    source: Source
    ssm_parameter: str | None
    ships: dict[str, Component]
    first_boot_adds: str

    def shipped(self) -> str:
        """`python 3.10, aws_cli 2, nvidia_driver` — what the image has, versions where the catalog names one."""
        return ", ".join(name + (f" {c.version}" if c.version else "") for name, c in self.ships.items() if c.present)


@dataclass(frozen=True)
class ImageCatalog:
    images: dict[str, Image]
    ec2_images: dict[str, str]  # accelerator -> image key (slurm-ec2's launch templates)

    def __getitem__(self, key: str) -> Image:
        if key not in self.images:
            raise ImageCatalogError(f"{IMAGES_PATH}: no image '{key}' under images (known: {', '.join(self.images)})")
        return self.images[key]

    def ec2_image(self, accelerator: str) -> Image:
        return self[self.ec2_images[accelerator]]


def _fail(where: str, problem: str, fix: str) -> ImageCatalogError:
    return ImageCatalogError(f"{IMAGES_PATH.name}: {where}: {problem} (fix: {fix})")


def _image(key: str, raw: Any) -> Image:
    where = f"images.{key}"
    if not isinstance(raw, dict):
        raise _fail(where, "not a mapping", "give name, os, source, ssm_parameter, ships, first_boot_adds")
    missing = {"name", "os", "source", "ssm_parameter", "ships", "first_boot_adds"} - set(raw)
    if missing:
        raise _fail(where, f"missing {', '.join(sorted(missing))}", "add them")
    if raw["source"] not in get_args(Source):
        raise _fail(f"{where}.source", f"{raw['source']!r}", f"one of {', '.join(get_args(Source))}")
    if (raw["source"] == "ssm") != bool(raw["ssm_parameter"]):
        raise _fail(f"{where}.ssm_parameter", "set exactly when source is ssm",
                    "name the public SSM parameter for source ssm, null otherwise")
    if raw["ssm_parameter"] and not str(raw["ssm_parameter"]).startswith("/aws/service/"):
        raise _fail(f"{where}.ssm_parameter", f"{raw['ssm_parameter']!r} is not a public parameter",
                    "use the /aws/service/... path AWS publishes")
    ships = raw["ships"]
    if not isinstance(ships, dict) or set(ships) != set(COMPONENTS):
        raise _fail(f"{where}.ships", f"has {sorted(ships) if isinstance(ships, dict) else ships!r}",
                    f"list exactly {', '.join(COMPONENTS)}")
    components = {}
    for name in COMPONENTS:
        fact = ships[name]
        at = f"{where}.ships.{name}"
        if not isinstance(fact, dict) or set(fact) != {"present", "version", "source"}:
            raise _fail(at, "not {present, version, source}", "give all three")
        if not isinstance(fact["present"], bool):
            raise _fail(f"{at}.present", f"{fact['present']!r}", "true or false")
        if fact["version"] is not None and (not fact["present"] or not isinstance(fact["version"], str)):
            raise _fail(f"{at}.version", f"{fact['version']!r}", "a quoted version of a present component, or null")
        if not str(fact["source"]).startswith("https://"):
            raise _fail(f"{at}.source", f"{fact['source']!r}", "the public https:// page that says it")
        components[name] = Component(fact["present"], fact["version"], str(fact["source"]))
    return Image(key, str(raw["name"]), str(raw["os"]), raw["source"], raw["ssm_parameter"], components,
                 str(raw["first_boot_adds"]))


def parse_catalog(raw: Any) -> ImageCatalog:
    if not isinstance(raw, dict) or set(raw) != {"images", "ec2_images"}:
        raise _fail("top level", "needs exactly the keys images and ec2_images", "see the file's header")
    images = {str(key): _image(str(key), value) for key, value in raw["images"].items()}
    ec2 = raw["ec2_images"]
    if not isinstance(ec2, dict) or set(ec2) != set(ACCELERATORS):
        raise _fail("ec2_images", f"has {ec2!r}", f"map each of {', '.join(ACCELERATORS)} to an image key")
    for accelerator, key in ec2.items():
        if key not in images or images[key].source != "ssm":
            raise _fail(f"ec2_images.{accelerator}", f"{key!r} is not an image with an SSM parameter",
                        "name an image of source ssm (launch templates resolve its parameter)")
    return ImageCatalog(images, {str(k): str(v) for k, v in ec2.items()})


@lru_cache(maxsize=1)
def load_images(path: Path = IMAGES_PATH) -> ImageCatalog:
    return parse_catalog(yaml.safe_load(path.read_text(encoding="utf-8")))


def node_kinds(tenant: Tenant) -> list[tuple[str, str]]:
    """(node kind, accelerator) of the tenant's nodes: controller, login, each queue."""
    kinds: list[tuple[str, str]] = [("controller", tenant.controller.accelerator)]
    if tenant.login is not None and tenant.login_count > 0:
        kinds.append(("login", tenant.login.accelerator))
    kinds += [(f"queue {q.name}", q.instance.accelerator) for q in tenant.queues]
    return kinds


def image_lines(tenant: Tenant, scheduler_image: Callable[[str], str], substrate_image: str | None) -> list[str]:
    """For plan and the deploy summary: which image each node kind boots and what first boot adds to it.
    `scheduler_image`: the tenant's scheduler's image for an accelerator (Scheduler.image); `substrate_image`:
    the image the provider boots instead (Provider.node_image). Passed in, so that this catalog module, which the
    cluster templates read, depends on neither registry."""
    catalog = load_images()
    by_image: dict[str, list[str]] = {}
    for kind, accelerator in node_kinds(tenant):
        by_image.setdefault(scheduler_image(accelerator), []).append(kind)
    lines = ["Node images (data/images.yml):"]
    for key, kinds in by_image.items():
        image = catalog[key]
        lines += [f"  {', '.join(kinds)}: {image.name} (ships {image.shipped()})",
                  f"    first boot adds: {image.first_boot_adds}"]
    # A substrate that boots its own image instead of AWS's names it (provider local: the pristine rootfs).
    if substrate_image:
        local = catalog[str(substrate_image)]
        lines.append(f"  here every node boots {local.name} instead; first boot adds: {local.first_boot_adds}")
    return lines

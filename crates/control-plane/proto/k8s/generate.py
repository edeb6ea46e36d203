#!/usr/bin/env python3
"""Regenerates the Kubernetes protobuf schemas under this directory.

The message layouts (field numbers, wire types, repeated/map shapes) come from the prost
sources of the k8s-pb crate, which are generated from upstream's `generated.proto` files.
prost renames fields to snake_case, so each field gets its upstream name back from the
k8s-openapi crate (whose deserializers list the JSON names, which go-to-protobuf also uses
as proto field names); fields k8s-openapi does not know fall back to lowerCamelCase.
A field that k8s-openapi declares without `Option` is required (marked `// +required` here
and listed in src/apiserver/protobuf/hints.rs, so the transcoder keeps its zero values, which
upstream's JSON always writes); a message field whose own fields are the outer type's JSON
fields is a Go struct embedded with `json:",inline"` (also listed in hints.rs).

K8S_PB_SRC is the src/ directory of the k8s-pb crate (unpack its .crate file from cargo's
registry cache); K8S_OPENAPI_SRC the src/ of the k8s-openapi crate the workspace uses. To
serve a new API group, add its package to PACKAGES, rerun, and list its Go pointer fields in
src/apiserver/protobuf/pointers.rs.

Usage: generate.py K8S_PB_SRC K8S_OPENAPI_SRC/v1_33 ../../src/apiserver/protobuf/hints.rs
       rustfmt --edition 2024 ../../src/apiserver/protobuf/hints.rs
"""
import os
import re
import sys

PACKAGES = [
    "api/core/v1", "api/apps/v1", "api/coordination/v1", "api/discovery/v1",
    "api/events/v1", "api/node/v1", "api/policy/v1", "api/scheduling/v1",
    "api/autoscaling/v1", "api/authentication/v1", "api/batch/v1", "api/storage/v1",
    "api/rbac/v1", "api/authorization/v1", "api/networking/v1",
    "apimachinery/pkg/apis/meta/v1", "apimachinery/pkg/runtime",
    "apimachinery/pkg/api/resource", "apimachinery/pkg/util/intstr",
]

ATTR = re.compile(r'#\[prost\((.*)\)\]')
FIELD = re.compile(r'pub (?:r#)?(\w+):\s*(.*),$')
STRUCT = re.compile(r'pub struct (\w+) \{')


def proto_package(modpath):
    return "k8s.io." + ".".join(modpath)


def parse_pb(src, pkg):
    """Returns [(message, [(attr, rust_name, rust_type)])] for one k8s-pb module."""
    text = open(os.path.join(src, pkg, "mod.rs")).read()
    messages, cur, pending_attr, buf = [], None, None, None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("///") or not line:
            continue
        m = STRUCT.match(line)
        if m:
            cur = (m.group(1), [])
            messages.append(cur)
            continue
        if cur is None:
            continue
        if line == "}":
            cur = None
            continue
        m = ATTR.match(line)
        if m:
            pending_attr = m.group(1)
            continue
        if buf is not None:
            buf += " " + line
        elif line.startswith("pub "):
            buf = line
        if buf is not None and buf.endswith(",") and buf.count("<") == buf.count(">"):
            buf = re.sub(r"<\s+", "<", re.sub(r",\s*>", ">", buf))
            fm = FIELD.match(buf)
            if not fm:
                sys.exit(f"cannot parse field in {pkg}: {buf}")
            cur[1].append((pending_attr, fm.group(1), fm.group(2)))
            buf, pending_attr = None, None
    return messages


def resolve(pkg, rust_type):
    """The proto full name of a message type named by a (relative) Rust path."""
    t = rust_type
    for wrap in ("::core::option::Option<", "::prost::alloc::vec::Vec<", "::prost::alloc::boxed::Box<"):
        while t.startswith(wrap):
            t = t[len(wrap):-1]
    parts = t.split("::")
    mod = pkg.split("/")
    while parts and parts[0] == "super":
        parts.pop(0)
        mod = mod[:-1]
    mod = mod + parts[:-1]
    return proto_package(mod), upstream_name(proto_package(mod), parts[-1])


RENAMES = {}


def openapi_names(oa, pkg):
    """Upstream message names (prost re-cases acronyms: PodDNSConfig became PodDnsConfig)."""
    d = os.path.join(oa, pkg)
    names = {}
    if os.path.isdir(d):
        for fn in os.listdir(d):
            if fn.endswith(".rs"):
                for n in re.findall(r'pub struct (\w+)', open(os.path.join(d, fn)).read()):
                    names[n.lower()] = n
    return names


def upstream_name(package, prost_name):
    return RENAMES.get((package, prost_name), prost_name)


def openapi_fields(oa, pkg, message):
    """JSON names and required-ness of a k8s-openapi struct, keyed by a normalised name."""
    d = os.path.join(oa, pkg)
    if not os.path.isdir(d):
        return {}
    for fn in os.listdir(d):
        if not fn.endswith(".rs"):
            continue
        text = open(os.path.join(d, fn)).read()
        if not re.search(r'pub struct %s\b' % re.escape(upstream_name(proto_package(pkg.split("/")), message)), text):
            continue
        names = {}
        for json_name, key in re.findall(r'"([^"]+)" => Field::Key_(\w+)', text):
            ty = re.search(r'pub (?:r#)?%s: (.*),\n' % re.escape(key), text)
            required = bool(ty) and not ty.group(1).startswith("Option<")
            names[norm(json_name)] = (json_name, required)
        return names
    return {}


def norm(name):
    return name.replace("_", "").lower()


def camel(snake):
    head, *rest = snake.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


SPECIAL_NAMES = {
    # Messages whose proto names are not JSON names (the transcoder special-cases them).
    ("FieldsV1", "raw"): "Raw",
}


def render(pb, oa, pkg, out, all_messages, hints):
    messages = parse_pb(pb, pkg)
    imports = set()
    body = []
    fallbacks = []
    for message, fields in messages:
        known = openapi_fields(oa, pkg, message)
        message = upstream_name(proto_package(pkg.split("/")), message)
        body.append(f"message {message} {{")
        for attr, rname, rtype in fields:
            parts = [p.strip() for p in attr.split(",")]
            tag = re.search(r'tag = "(\d+)"', attr).group(1)
            if (message, rname) in SPECIAL_NAMES:
                name, required = SPECIAL_NAMES[(message, rname)], False
            elif norm(rname) in known:
                name, required = known[norm(rname)]
            else:
                name, required = camel(rname), False
                if known and attr.startswith("message") and embedded(pkg, rtype, known, all_messages):
                    hints["inline"].append((f"{proto_package(pkg.split('/'))}.{message}", name))
                elif known:
                    fallbacks.append(f"{pkg} {message}.{name}")
            if required:
                hints["required"].append((f"{proto_package(pkg.split('/'))}.{message}", name))
            if attr.startswith("btree_map") or attr.startswith("map"):
                k, v = re.search(r'map = "(\w+), (\w+)"', attr).groups()
                if v == "message":
                    value_ty = rtype.rsplit(",", 1)[1].strip()[:-1]
                    vp, vm = resolve(pkg, value_ty)
                    v = vm if vp == proto_package(pkg.split("/")) else f"{vp}.{vm}"
                    if vp != proto_package(pkg.split("/")):
                        imports.add(vp)
                decl = f"map<{k}, {v}> {name} = {tag};"
            else:
                kind = parts[0].split(" ")[0]
                label = "repeated" if "repeated" in parts else "optional"
                if kind == "message":
                    mp, mm = resolve(pkg, rtype)
                    ty = mm if mp == proto_package(pkg.split("/")) else f"{mp}.{mm}"
                    if mp != proto_package(pkg.split("/")):
                        imports.add(mp)
                else:
                    ty = kind
                decl = f"{label} {ty} {name} = {tag};"
            body.append(f"  {decl}" + ("  // +required" if required else ""))
        body.append("}")
        body.append("")
    path = os.path.join(out, pkg, "generated.proto")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(f"// Generated by generate.py from {SOURCES}; do not edit.\n")
        f.write("// The layouts are upstream's k8s.io generated.proto schemas.\n\n")
        f.write('syntax = "proto2";\n\n')
        f.write(f"package {proto_package(pkg.split('/'))};\n\n")
        for imp in sorted(imports):
            ipath = "/".join(imp.split(".")[2:])
            f.write(f'import "{ipath}/generated.proto";\n')
        f.write("\n")
        f.write("\n".join(body))
    return imports, fallbacks


def embedded(pkg, rtype, known, all_messages):
    """Whether a message field is a Go struct embedded with `json:",inline"`: its own
    fields are all fields of the outer type's JSON form."""
    mp, mm = resolve(pkg, rtype)
    inner = all_messages.get((mp, mm))
    hits = sum(norm(rname) in known for _, rname, _ in inner) if inner else 0
    # A few fields newer than k8s-openapi's API version may be missing from `known`.
    return bool(inner) and hits >= 0.9 * len(inner)


def write_hints(hints, path):
    with open(path, "w") as f:
        f.write("//! Generated by proto/k8s/generate.py; do not edit.\n")
        f.write("//! Facts about upstream's Go types that the proto schemas cannot carry.\n\n")
        f.write("/// Fields of Go structs embedded with `json:\",inline\"`: their fields appear in the\n")
        f.write("/// outer object's JSON, not under the proto field's name.\n")
        f.write("pub(super) static INLINE: &[(&str, &str)] = &[\n")
        for m, fld in hints["inline"]:
            f.write(f'    ("{m}", "{fld}"),\n')
        f.write("];\n\n")
        f.write("/// Required fields (no `omitempty` upstream): JSON carries them even when zero.\n")
        f.write("pub(super) static REQUIRED: &[(&str, &str)] = &[\n")
        for m, fld in hints["required"]:
            f.write(f'    ("{m}", "{fld}"),\n')
        f.write("];\n")


SOURCES = "the k8s-pb and k8s-openapi crates"


def crate_name(path):
    """`k8s-pb-0.9.0` from a path inside a crate's source directory."""
    m = re.search(r"(k8s-(?:pb|openapi)-[0-9.]+)", os.path.abspath(path))
    return m.group(1) if m else path


def main():
    global SOURCES
    pb, oa = sys.argv[1], sys.argv[2]
    SOURCES = f"{crate_name(pb)} and {crate_name(oa)} ({os.path.basename(oa.rstrip('/'))})"
    out = os.path.dirname(os.path.abspath(__file__))
    wanted = {proto_package(p.split("/")) for p in PACKAGES}
    all_messages = {}
    for pkg in PACKAGES:
        known = openapi_names(oa, pkg)
        for message, _ in parse_pb(pb, pkg):
            if message.lower() in known:
                RENAMES[(proto_package(pkg.split("/")), message)] = known[message.lower()]
    for pkg in PACKAGES:
        for message, fields in parse_pb(pb, pkg):
            package = proto_package(pkg.split("/"))
            all_messages[(package, upstream_name(package, message))] = fields
    hints = {"inline": [], "required": []}
    for pkg in PACKAGES:
        imports, fallbacks = render(pb, oa, pkg, out, all_messages, hints)
        missing = imports - wanted
        if missing:
            sys.exit(f"{pkg} imports packages not generated: {sorted(missing)}")
        for fb in fallbacks:
            print("name not in k8s-openapi, camelCased:", fb)
    write_hints(hints, sys.argv[3])


main()

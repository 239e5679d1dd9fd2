#!/usr/bin/env python3
# Compares the SASS of two `cuobjdump -sass` dumps (e.g. of build/libmsa.a before and after a
# refactor) kernel by kernel: prints each function as identical or changed with its instruction
# counts. Python 3 standard library only.
#
# usage: sass_diff.py OLD.sass NEW.sass [--filter REGEX]
#
# A function's body is the text from its `Function :` line to the `..........` that closes it.
# Address comments (/*0a30*/) are stripped and whitespace is collapsed; everything else, the
# encoding words included, must match. A name that occurs more than once (the same kernel
# instantiated in two translation units) is compared occurrence by occurrence, in file order.
# Exit status: 0 when every selected function is identical and present in both dumps, else 1.
import argparse
import re
import sys
from collections import defaultdict

FUNC = re.compile(r"^\s*Function : (\S+)")
MEMBER = re.compile(r"^member (\S+):$")
ADDR = re.compile(r"/\*[0-9a-fA-F]{4,}\*/")
END = re.compile(r"^\s*\.{10}\s*$")


def parse(path):
    """Returns {name: [(member, [normalised lines], instruction count), ...]} in file order."""
    funcs = defaultdict(list)
    member, name, body, count = "?", None, [], 0

    def close():
        if name is not None:
            funcs[name].append((member, body, count))

    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = MEMBER.match(line)
            if m:
                close()
                name = None
                member = m.group(1).rsplit(":", 1)[-1].rsplit("/", 1)[-1]
                continue
            m = FUNC.match(line)
            if m:
                close()
                name, body, count = m.group(1), [], 0
                continue
            if name is None:
                continue
            if END.match(line):
                close()
                name = None
                continue
            if ADDR.search(line):
                count += 1
            text = " ".join(ADDR.sub("", line).split())
            if text:
                body.append(text)
    close()
    return funcs


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i, x, y
    i = min(len(a), len(b))
    return i, a[i] if i < len(a) else "<end>", b[i] if i < len(b) else "<end>"


def main():
    ap = argparse.ArgumentParser(description="Per-kernel SASS comparison of two cuobjdump -sass dumps.")
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--filter", default=None, help="only functions whose (mangled) name matches")
    args = ap.parse_args()
    flt = re.compile(args.filter) if args.filter else None
    old, new = parse(args.old), parse(args.new)
    names = sorted(n for n in set(old) | set(new) if flt is None or flt.search(n))
    identical = changed = missing = 0
    for n in names:
        a, b = old.get(n, []), new.get(n, [])
        for k in range(max(len(a), len(b))):
            tag = f"{n}" + (f" #{k + 1}" if max(len(a), len(b)) > 1 else "")
            if k >= len(a) or k >= len(b):
                missing += 1
                side = "NEW" if k >= len(a) else "OLD"
                member, _, cnt = (b if k >= len(a) else a)[k]
                print(f"only in {side:<4} {cnt:6d} instr  {tag}  [{member}]")
                continue
            (ma, la, ca), (mb, lb, cb) = a[k], b[k]
            if la == lb:
                identical += 1
                print(f"identical  {ca:6d} instr  {tag}  [{mb}]")
            else:
                changed += 1
                i, x, y = first_difference(la, lb)
                print(f"changed    {ca:6d} -> {cb:6d} instr  {tag}  [{ma} -> {mb}]")
                print(f"    first difference at body line {i}:\n      old: {x}\n      new: {y}")
    print(f"{len(names)} names: {identical} identical, {changed} changed, {missing} in one dump only")
    return 0 if changed == 0 and missing == 0 and names else 1


if __name__ == "__main__":
    sys.exit(main())

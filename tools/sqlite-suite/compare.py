#!/usr/bin/env python3
"""Compares the baseline and bpe runs of SQLite's TCL test files (run.sh's output).

For each file: errors/tests of both modes, the failing cases that only the bpe run has (a file
that did not reach its summary counts as the pseudo-case ABORT, TIMEOUT or CRASH-SIGn; the
leak checks as UNFREED-MEMORY and FILES-LEFT-OPEN), and files whose bpe run executed fewer
cases. bpe-only failures not matched by expected-failures.txt make the exit status 1.

expected-failures.txt: one per line, `test-file  case-glob  reason...` (whitespace-separated;
globs as fnmatch; '#' starts a comment). A test-file field written `children=bpe:FILE` applies
only to runs whose spawned processes also use bpe (run.sh --children bpe).
"""
import argparse
import fnmatch
import json
import os
import re
import sys

SUMMARY = re.compile(r'^(\d+) errors out of (\d+) tests')
FAILURES = re.compile(r'^!Failures on these tests:(.*)$')
CASE_LINE = re.compile(r'^(\S+)\.\.\.')


def parse(path_dir, timeout):
    out_path = os.path.join(path_dir, 'out.txt')
    st_path = os.path.join(path_dir, 'status')
    if not os.path.exists(st_path):
        return None
    _f, _mode, rc, secs = open(st_path).read().strip().split('\t')
    rc, secs = int(rc), float(secs)
    text = open(out_path, errors='replace').read() if os.path.exists(out_path) else ''
    lines = text.splitlines()
    r = {'rc': rc, 'secs': secs, 'errors': None, 'tests': None, 'failed': [], 'pseudo': [],
         'text': {}, 'cases_seen': 0, 'tail': '\n'.join(lines[-8:])}
    seen = set()
    for ln in lines:
        m = CASE_LINE.match(ln)
        if m:
            seen.add(m.group(1))
        m = SUMMARY.match(ln)
        if m:
            r['errors'], r['tests'] = int(m.group(1)), int(m.group(2))
        m = FAILURES.match(ln)
        if m:
            r['failed'] = m.group(1).split()
        if ln.startswith('Unfreed memory:'):
            r['pseudo'].append('UNFREED-MEMORY')
            r['text']['UNFREED-MEMORY'] = ln
        if ln.endswith('files were left open'):
            r['pseudo'].append('FILES-LEFT-OPEN')
            r['text']['FILES-LEFT-OPEN'] = ln
    r['cases_seen'] = len(seen)
    if r['tests'] is None:
        if rc in (124, 137) or secs >= timeout - 1:
            kind = 'TIMEOUT'
        elif rc > 128:
            kind = f'CRASH-SIG{rc - 128}'
        else:
            kind = 'ABORT'
        r['pseudo'].append(kind)
        # The uncaught Tcl error ("<testfixture>: message" before "while executing"), and the
        # last test case started.
        msg = [ln for i, ln in enumerate(lines)
               if i + 1 < len(lines) and lines[i + 1].strip() == 'while executing']
        last = [m.group(1) for m in map(CASE_LINE.match, lines) if m]
        desc = (msg[0].split(': ', 1)[-1] if msg else r['tail'])
        if last:
            desc = f'after {last[-1]}: {desc}'
        r['text'][kind] = desc
    # Error text of each failed case.
    for name in r['failed']:
        msg = []
        for i, ln in enumerate(lines):
            if ln.startswith(f'! {name} expected:') or ln.startswith(f'! {name} got:'):
                msg.append(ln[2:])
            elif ln.startswith('Error: ') and i > 0 and lines[i - 1].rstrip().endswith(f'{name}...'):
                msg.append(ln)
            elif ln.startswith('Error: ') and i > 1 and lines[i - 1] == '' \
                    and lines[i - 2].rstrip().endswith(f'{name}...'):
                msg.append(ln)
        r['text'][name] = '\n'.join(msg)[:600]
    return r


def load_expected(path):
    exp = []
    if not os.path.exists(path):
        return exp
    for ln in open(path):
        ln = ln.split('#', 1)[0].strip()
        if not ln:
            continue
        parts = ln.split(None, 2)
        if len(parts) < 2:
            continue
        exp.append((parts[0], parts[1], parts[2] if len(parts) > 2 else ''))
    return exp


def expected_reason(exp, f, case, children):
    for ef, pat, reason in exp:
        if ef.startswith('children='):
            mode, ef = ef[len('children='):].split(':', 1)
            if mode != children:
                continue
        if fnmatch.fnmatchcase(f, ef) and fnmatch.fnmatchcase(case, pat):
            return reason or 'expected'
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--run-dir', required=True)
    ap.add_argument('--expected', required=True)
    ap.add_argument('--timeout', type=float, default=600)
    ap.add_argument('--children', default='plain')
    ap.add_argument('files', nargs='*')
    a = ap.parse_args()
    exp = load_expected(a.expected)
    files = a.files or sorted({d for m in ('baseline', 'bpe')
                               for d in os.listdir(os.path.join(a.run_dir, m))})
    rows, unexpected, expected_hits, fewer, records, not_run = [], [], [], [], [], []
    tot = {'base_s': 0.0, 'bpe_s': 0.0}
    for f in files:
        key = f.replace('/', '_')
        b = parse(os.path.join(a.run_dir, 'baseline', key), a.timeout)
        p = parse(os.path.join(a.run_dir, 'bpe', key), a.timeout)
        if b is None or p is None:
            rows.append((f, 'not run', 'not run', '', '', ''))
            not_run.append(f)
            continue
        tot['base_s'] += b['secs']
        tot['bpe_s'] += p['secs']
        bset = set(b['failed']) | set(b['pseudo'])
        only = [c for c in p['failed'] + p['pseudo'] if c not in bset]
        # Dedupe, keep order.
        only = list(dict.fromkeys(only))
        n_unexp = 0
        for c in only:
            reason = expected_reason(exp, f, c, a.children)
            rec = {'file': f, 'case': c, 'expected': reason, 'error': p['text'].get(c, '')}
            records.append(rec)
            if reason is None:
                unexpected.append(rec)
                n_unexp += 1
            else:
                expected_hits.append(rec)
        bt = b['tests'] if b['tests'] is not None else b['cases_seen']
        pt = p['tests'] if p['tests'] is not None else p['cases_seen']
        note = []
        if pt < bt:
            note.append(f'fewer cases {pt}<{bt}')
            fewer.append((f, bt, pt))
        if p['pseudo']:
            note.append('/'.join(p['pseudo']))
        def cell(r):
            if r['tests'] is None:
                return f"{'/'.join(r['pseudo'])} ({r['cases_seen']} seen)"
            return f"{r['errors']}/{r['tests']}"
        rows.append((f, cell(b), cell(p), f"{b['secs']:.0f}/{p['secs']:.0f}",
                     f"{len(only)} ({n_unexp} unexpected)" if only else '0', '; '.join(note)))

    w = max([len(r[0]) for r in rows] + [4])
    print(f"\n{'file':<{w}}  {'baseline err/tests':<24} {'bpe err/tests':<24} {'secs b/bpe':<11} "
          f"{'bpe-only':<18} notes")
    for r in rows:
        print(f"{r[0]:<{w}}  {r[1]:<24} {r[2]:<24} {r[3]:<11} {r[4]:<18} {r[5]}")
    print(f"\ntotal test time: baseline {tot['base_s']:.0f} s, bpe {tot['bpe_s']:.0f} s "
          f"(summed over files; wall time is less with parallel jobs)")
    if expected_hits:
        print(f"\nbpe-only failures listed in expected-failures.txt: {len(expected_hits)}")
        for r in expected_hits:
            print(f"  {r['file']} {r['case']}: {r['expected']}")
    if fewer:
        print("\nfiles whose bpe run executed fewer cases than the baseline:")
        for f, bt, pt in fewer:
            print(f"  {f}: {pt} < {bt}")
    with open(os.path.join(a.run_dir, 'bpe-only.json'), 'w') as out:
        json.dump(records, out, indent=1)
    if not_run:
        print(f"\nnot run (no status for one of the modes): {' '.join(not_run)}")
    n_run = len(files) - len(not_run)
    if unexpected:
        print(f"\nUNEXPECTED bpe-only failures: {len(unexpected)}")
        shown = {}
        for r in unexpected:
            shown[r['file']] = shown.get(r['file'], 0) + 1
            if shown[r['file']] == 6:
                n = sum(1 for x in unexpected if x['file'] == r['file'])
                print(f"  {r['file']}: ... {n - 5} more (all in {a.run_dir}/bpe-only.json)")
            if shown[r['file']] > 5:
                continue
            print(f"  {r['file']} {r['case']}")
            for ln in r['error'].splitlines()[:6]:
                print(f"      {ln[:300]}")
        nf = len(set(r['file'] for r in unexpected))
        print(f"\n{n_run - nf} passed, {nf} failed")
        return 1
    print(f"\nno unexpected bpe-only failure\n{n_run} passed, 0 failed")
    return 1 if not_run else 0


if __name__ == '__main__':
    sys.exit(main())

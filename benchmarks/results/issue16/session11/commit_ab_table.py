"""The table of commit_ab.sh's output (lines "SIDE ROUND JSON-ROWS"): median kernel us per case and side.

    python commit_ab_table.py RAW
"""
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    side, r, payload = line.split(" ", 2)
    for i, row in enumerate(json.loads(payload)):
        rows.setdefault(i, {"case": row["case"]}).setdefault(side, []).append(row["kernel_us"])
print("| case | s10 us | new us | new / s10 speed |\n|---|---|---|---|")
for i, row in rows.items():
    a, b = statistics.median(row["s10"]), statistics.median(row["new"])
    print(f"| {row['case']} | {a:.0f} | {b:.0f} | {a / b:.3f} |")

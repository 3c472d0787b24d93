"""Print the README's ladder table from a bench record: python benchmarks/readme_table.py PATH/ladder.json"""

import json
import sys

from gpt2ladder.report.bench import readme_table

if __name__ == "__main__":
    print(readme_table(json.load(open(sys.argv[1]))), end="")

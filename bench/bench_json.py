"""The JSON output of the bench scripts: `write_document(document, destination)`."""

import json


def write_document(document, destination):
    """Writes `document` to the file `destination`, or on stdout alone for "-" (what ferry-bench
    reads from the scripts it runs); nothing for None."""
    if destination == "-":
        print(json.dumps(document))
    elif destination:
        with open(destination, "w") as f:
            json.dump(document, f, indent=1)

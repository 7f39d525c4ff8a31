"""Protocol-independent building blocks: datatypes, errors, requests, responses, statistics."""

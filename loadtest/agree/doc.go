// Package agree measures how often the routers of one cluster choose the
// same backend for the same request at the same moment: it asks every
// router's route explainer (POST /debug/route/<path> on the admin
// listener, which decides as the request path would and sends nothing) for
// a fixed set of requests, all routers at once, round after round, and
// counts the rounds' picks that agree, the owners (the load-blind first
// choice) that agree, and the rounds in which every router answered at the
// same epoch. The demo runs it from the end of a run's warm-up to its end
// (warmroute demo --agreement). The chaos suite's prober, which also
// follows faults, reads the same Explanation.
package agree

// Command warmroute is the prefix-aware router for LLM inference fleets and
// its companion tools, one binary with subcommands:
//
//	serve      run a router node (alone, or in a cluster with --join)
//	gpusim     serve simulated vLLM instances
//	loadtest   drive an OpenAI-compatible endpoint and report
//	demo       a local fleet and routers, strategies compared side by side
//	chaos      faults under load against local processes or the compose stack
//	status, backends, config
//	           the admin API from the command line
//	tls        the cluster CA and router certificates (ca create, cert
//	           create, show)
//	version    print the version and build information (also --version)
//
// `warmroute help` lists the commands and `warmroute <command> --help` every
// flag with its default. Flags may follow a command's arguments; durations
// take a unit (500ms, 2s). Exit status: 0 ok, 1 failed, 2 bad command line.
// The README describes configuration, deployment and metrics;
// docs/configuration.md lists every serve setting, by section, with its
// flag, variable, YAML key and default.
package main

// Package ring decides where an LLM request goes. It is pure: no network, no
// clocks, no cluster state. Give it the same inputs and it gives the same
// answer on every router node.
//
// Two jobs live here:
//
//   - Routing keys. [Extract] reads an OpenAI chat or completions body, or a
//     SageMaker /invocations body, and returns a 64-bit key: xxhash64 of the
//     model, the tenant and the first PrefixLength bytes of the prompt text,
//     or the prompt's block chain, from which [Splits] picks the shortest
//     prefix that is not split (ADAPTIVE keys).
//     For chat the prompt text is the messages' roles and text in order, not
//     the raw JSON, so whitespace, key order and sampling fields never change
//     the key.
//
//   - Placement. [New] builds an immutable [Ring] from a backend set: an owner
//     per partition (buraksezer/consistent with bounded partition load) and a
//     deterministic overflow order per partition. [Ring.Pick] walks that order
//     against live loads supplied through the small [Loads] interface (the
//     fleet's in-flight total, for the bounded-loads cap, through
//     [LoadTotals] when the loads keep one, e.g. with a [Tally]) and
//     returns a [Decision]: the backend and why (affinity, overflow with its
//     rank, fallback, or the name of a load-blind strategy).
//
// [Strategies] and [Reasons] are the one table of strategies (name,
// description, what each knows, the agreed-state command level it needs)
// and of decision reasons (the decision label). Flags, help, docs, the
// proxy's metrics, the command level check of node/cluster and the tools
// read them, so a new strategy or reason is a constant and a row there.
//
// A membership or config change builds a new Ring; callers publish it with an
// atomic.Pointer, so lookups never take a lock. See DESIGN.md for the
// reasoning behind the overflow order and the naming of ring members.
package ring

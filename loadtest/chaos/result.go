package chaos

import "time"

// Event is one step of a fault's timeline.
type Event struct {
	At   time.Duration `json:"t"` // since the start of the run
	What string        `json:"what"`
}

// Settle is a change that settled (a write acknowledged, a router back, a
// commit observed) and how long agreement took to come back after it.
type Settle struct {
	What string        `json:"what"`
	At   time.Duration `json:"t"`
	// Until ends the window in which agreement is looked for: the next
	// step of the fault (0: the end of the fault).
	Until time.Duration `json:"until,omitempty"`
	// Delay is the time to the first tick of lasting 100% agreement of
	// the picks; OK is false when they were not back to 100% by the end.
	Delay time.Duration `json:"delay_ns"`
	OK    bool          `json:"ok"`
	// OwnerDelay and OwnerOK are the same for the load-blind owners.
	OwnerDelay time.Duration `json:"owner_delay_ns"`
	OwnerOK    bool          `json:"owner_ok"`
	// Sample describes the first disagreement of picks seen after it.
	Sample string `json:"sample,omitempty"`
	// Detection marks a physical event (a backend killed or back) rather
	// than a change the cluster settled: its delay is how long the routers
	// took to notice, reported but not held to the reconvergence bound.
	Detection bool `json:"detection,omitempty"`
}

// Result is what one fault did to the cluster.
type Result struct {
	Fault   Fault  `json:"fault"`
	Skipped string `json:"skipped,omitempty"` // why it did not run
	Failed  string `json:"failed,omitempty"`  // why it stopped part way
	// Victim is the router or backend the fault hit.
	Victim string `json:"victim,omitempty"`
	// Start is the start of the pre-fault window, Inject the fault, End
	// the end of observation (all since the start of the run).
	Start  time.Duration `json:"start"`
	Inject time.Duration `json:"inject"`
	End    time.Duration `json:"end"`
	Events []Event       `json:"events"`

	Errors  Errors   `json:"errors"`
	Outages []Outage `json:"outages,omitempty"`
	victims []string

	// AgreementMin is the lowest agreement from the fault to the end;
	// AgreementSeen is false when no tick had two routers answering.
	AgreementMin  float64 `json:"agreement_min"`
	AgreementSeen bool    `json:"agreement_seen"`
	// OwnerAgreementMin is the same for the load-blind owners.
	OwnerAgreementMin float64  `json:"owner_agreement_min"`
	Settles           []Settle `json:"settles"`

	// Moved compares the owners before the fault with those while it
	// lasted (or after a backend change); Returned compares before with
	// after the fault was healed (nil when not taken).
	Moved    *Movement `json:"moved,omitempty"`
	Returned *Movement `json:"returned,omitempty"`
	// Backends is the fleet size before the change (for the 1/N bound).
	Backends int `json:"backends"`

	KV Dip `json:"kv"`

	// Backend removal: the committed epoch and the requests that reached
	// the removed backend with an epoch at or past it, or started after
	// the write was acknowledged.
	RemovalEpoch uint64 `json:"removal_epoch,omitempty"`
	LateByEpoch  int    `json:"late_by_epoch"`
	LateByTime   int    `json:"late_by_time"`
	removalAck   time.Duration

	// Failover is the time from a leader kill to the survivors agreeing on
	// a new leader.
	Failover  time.Duration `json:"failover_ns,omitempty"`
	NewLeader string        `json:"new_leader,omitempty"`

	Notes []string `json:"notes,omitempty"`
}

// delay returns a settle's delay to agreement at level l.
func (s Settle) delay(l Level) (time.Duration, bool) {
	if l == Owners {
		return s.OwnerDelay, s.OwnerOK
	}
	return s.Delay, s.OK
}

// Worst returns the settle with the longest delay to agreement at level l
// (one never back to 100% counts as the longest), detections left out, and
// false when there is none.
func (r *Result) Worst(l Level) (Settle, bool) {
	var w Settle
	found := false
	for _, s := range r.Settles {
		if s.Detection {
			continue
		}
		sd, sok := s.delay(l)
		wd, wok := w.delay(l)
		switch {
		case !found:
			w, found = s, true
		case wok && !sok:
			w = s
		case wok == sok && sd > wd:
			w = s
		}
	}
	return w, found
}

// Report is a whole run against one target.
type Report struct {
	Target   string        `json:"target"`
	Describe string        `json:"describe"`
	Rate     float64       `json:"rate"`
	Workload string        `json:"workload"`
	Duration time.Duration `json:"duration_ns"`
	Requests int           `json:"requests"`
	Results  []Result      `json:"results"`
	Ticks    int           `json:"ticks"`
	// ProbeResolution is the median time between agreement samples.
	ProbeResolution time.Duration `json:"probe_resolution_ns"`
}

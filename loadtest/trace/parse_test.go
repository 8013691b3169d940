package trace

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseSample(t *testing.T) {
	f, err := os.Open("testdata/sample.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := Parse(f, ParseConfig{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Record{
		{Line: 1, Timestamp: 0, InputLength: 1100, OutputLength: 40, HashIDs: []int64{0, 1, 2}},
		{Line: 2, Timestamp: 0, InputLength: 700, OutputLength: 300, HashIDs: []int64{0, 3}},
		{Line: 4, Timestamp: 2500 * time.Millisecond, InputLength: 1600, OutputLength: 12, HashIDs: []int64{0, 1, 2, 4}},
		// a fractional timestamp, an unknown field, input a whole number of blocks
		{Line: 5, Timestamp: 1250500 * time.Microsecond, InputLength: 1024, OutputLength: 0, HashIDs: []int64{0, 3}},
		// no blanks; one hash id fewer than blocks (input_length // 512)
		{Line: 6, Timestamp: 4 * time.Second, InputLength: 2000, OutputLength: 7, HashIDs: []int64{0, 1, 2}},
	}
	if !reflect.DeepEqual(recs, want) {
		t.Fatalf("got\n%+v\nwant\n%+v", recs, want)
	}
}

func TestParseCRLFAndBlockSize(t *testing.T) {
	in := "{\"timestamp\": 1, \"input_length\": 33, \"output_length\": 1, \"hash_ids\": [7, 8, 9]}\r\n" +
		"{\"timestamp\": 2, \"input_length\": 16, \"output_length\": 1, \"hash_ids\": [ 7 ]}\r\n"
	recs, err := Parse(strings.NewReader(in), ParseConfig{BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || len(recs[0].HashIDs) != 3 || recs[1].HashIDs[0] != 7 {
		t.Fatalf("%+v", recs)
	}
}

func TestParseBadLines(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]}`
	cases := []struct {
		name, line string
		cfg        ParseConfig
		want       error
		text       string
	}{
		{"not JSON", `{"timestamp": 0,`, ParseConfig{}, ErrBadRecord, "unexpected end"},
		{"not an object", `[1, 2]`, ParseConfig{}, ErrBadRecord, "cannot unmarshal array"},
		{"null", `null`, ParseConfig{}, ErrBadRecord, "no timestamp"},
		{"no timestamp", `{"input_length": 600, "output_length": 4, "hash_ids": [0, 1]}`, ParseConfig{}, ErrBadRecord, "no timestamp"},
		{"no input_length", `{"timestamp": 0, "output_length": 4, "hash_ids": [0, 1]}`, ParseConfig{}, ErrBadRecord, "no input_length"},
		{"no output_length", `{"timestamp": 0, "input_length": 600, "hash_ids": [0, 1]}`, ParseConfig{}, ErrBadRecord, "no output_length"},
		{"no hash_ids", `{"timestamp": 0, "input_length": 600, "output_length": 4}`, ParseConfig{}, ErrBadRecord, "no hash_ids"},
		{"null hash_ids", `{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": null}`, ParseConfig{}, ErrBadRecord, "no hash_ids"},
		{"negative timestamp", `{"timestamp": -1, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]}`, ParseConfig{}, ErrBadRecord, "timestamp -1"},
		{"timestamp beyond a year", `{"timestamp": 1e12, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]}`, ParseConfig{}, ErrBadRecord, "timestamp 1e+12"},
		{"string timestamp", `{"timestamp": "0", "input_length": 600, "output_length": 4, "hash_ids": [0, 1]}`, ParseConfig{}, ErrBadRecord, "cannot unmarshal string"},
		{"zero input", `{"timestamp": 0, "input_length": 0, "output_length": 4, "hash_ids": []}`, ParseConfig{}, ErrBadRecord, "input_length 0"},
		{"fractional input", `{"timestamp": 0, "input_length": 600.5, "output_length": 4, "hash_ids": [0, 1]}`, ParseConfig{}, ErrBadRecord, "600.5"},
		{"input beyond int64", `{"timestamp": 0, "input_length": 1e30, "output_length": 4, "hash_ids": [0, 1]}`, ParseConfig{}, ErrBadRecord, "1e30"},
		{"input beyond the hash id limit", `{"timestamp": 0, "input_length": 9000000000, "output_length": 4, "hash_ids": [0, 1]}`, ParseConfig{}, ErrBadRecord, "input_length 9000000000 outside 1-2097152"},
		{"negative output", `{"timestamp": 0, "input_length": 600, "output_length": -4, "hash_ids": [0, 1]}`, ParseConfig{}, ErrBadRecord, "output_length -4"},
		{"huge output", `{"timestamp": 0, "input_length": 600, "output_length": 99999999, "hash_ids": [0, 1]}`, ParseConfig{}, ErrBadRecord, "output_length 99999999"},
		{"hash_ids not an array", `{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": 5}`, ParseConfig{}, ErrBadRecord, "not an array"},
		{"fractional id", `{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1.5]}`, ParseConfig{}, ErrBadRecord, `"1.5" is not an integer`},
		{"string id", `{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, "1"]}`, ParseConfig{}, ErrBadRecord, "not an integer"},
		{"nested ids", `{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [[0], 1]}`, ParseConfig{}, ErrBadRecord, "not an integer"},
		{"id beyond int64", `{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 99999999999999999999]}`, ParseConfig{}, ErrBadRecord, "not an integer"},
		{"negative id", `{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, -1]}`, ParseConfig{}, ErrBadRecord, "negative hash id -1"},
		{"too many ids", `{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1, 2]}`, ParseConfig{}, ErrBadRecord, "needs 2 hash ids of 512 tokens, got 3"},
		{"too few ids", `{"timestamp": 0, "input_length": 1600, "output_length": 4, "hash_ids": [0, 1]}`, ParseConfig{}, ErrBadRecord, "needs 4 hash ids of 512 tokens, got 2"},
		{"over the hash id limit", `{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1, 2, 3, 4]}`, ParseConfig{MaxHashIDs: 4}, ErrTooLarge, "more than 4 hash ids"},
		{"line too long", `{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [0, 1]}` + strings.Repeat(" ", 100), ParseConfig{MaxLineBytes: 100}, ErrTooLarge, "longer than 100 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(good+"\n\n"+c.line+"\n"+good+"\n"), c.cfg)
			var le *LineError
			if !errors.As(err, &le) || le.Line != 3 || !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.text) {
				t.Fatalf("got %v, want line 3, %v, %q", err, c.want, c.text)
			}
			if !strings.HasPrefix(err.Error(), "trace: line 3: ") {
				t.Fatalf("message %q", err)
			}
		})
	}
}

func TestParseFileLimits(t *testing.T) {
	var b strings.Builder
	for i := range 5 {
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": 1000, "output_length": 4, "hash_ids": [0, %d]}`+"\n", i, i+1)
	}
	if _, err := Parse(strings.NewReader(b.String()), ParseConfig{MaxRecords: 4}); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "line 5: ") {
		t.Fatalf("records: %v", err)
	}
	if _, err := Parse(strings.NewReader(b.String()), ParseConfig{MaxTotalHashIDs: 9}); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "line 5: ") {
		t.Fatalf("total hash ids: %v", err)
	}
	if _, err := Parse(strings.NewReader(""), ParseConfig{MaxRecords: -1}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("config: %v", err)
	}
	if recs, err := Parse(strings.NewReader("\n \n"), ParseConfig{}); err != nil || len(recs) != 0 {
		t.Fatalf("blank file: %v %v", recs, err)
	}
}

func TestWriteParseRoundTrip(t *testing.T) {
	recs, err := Generate(GenConfig{Seed: 3, Requests: 200, Rate: 50, BlockTokens: 64, MeanInputTokens: 500,
		MeanOutputTokens: 30, Turns: 4, Think: time.Second, DocShare: 0.3, Documents: 5})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := Write(&b, recs); err != nil {
		t.Fatal(err)
	}
	back, err := Parse(strings.NewReader(b.String()), ParseConfig{BlockTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, recs) {
		t.Fatal("records changed through Write and Parse")
	}
	if first, _, _ := strings.Cut(b.String(), "\n"); !strings.HasPrefix(first, `{"timestamp": 0, "input_length": `) || !strings.Contains(first, `"hash_ids": [0, 1, `) {
		t.Fatalf("first line %s", first)
	}
}

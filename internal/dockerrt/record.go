package dockerrt

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
)

// RecordFile is the record's name in the sandbox's state directory.
const RecordFile = "docker.json"

// Schema is the record's version.
const Schema = 1

// Record is docker.json (package doc). Field names are frozen.
type Record struct {
	Schema int    `json:"schema"`
	Name   string `json:"name"`
	// Image is the reference as configured; ImageID what it resolved to
	// when the sandbox was made, which every start uses.
	Image     string `json:"image"`
	ImageID   string `json:"image_id"`
	GateImage string `json:"gate_image,omitempty"`
	// Runtime is Docker's runtime for the workload: "runsc" or "runc".
	Runtime    string       `json:"runtime"`
	Subnet     netip.Prefix `json:"subnet,omitzero"`
	GateIP     netip.Addr   `json:"gate_ip,omitzero"`
	WorkloadIP netip.Addr   `json:"workload_ip,omitzero"`
	Bridge     string       `json:"bridge,omitempty"`
	// WorkStarted is when the workload container last started (Docker's
	// State.StartedAt), in moat-docker up's answer: a new value is a new
	// start, for which moat runs the on_up hooks. Not kept in the file.
	WorkStarted string `json:"work_started,omitempty"`
}

// ErrNoRecord is returned by Load for a sandbox that is not Docker's.
var ErrNoRecord = errors.New("no docker record")

// Load reads dir's record.
func Load(dir string) (*Record, error) {
	b, err := os.ReadFile(filepath.Join(dir, RecordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNoRecord
	}
	if err != nil {
		return nil, fmt.Errorf("reading the docker record: %w", err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", filepath.Join(dir, RecordFile), err)
	}
	if r.Schema > Schema {
		return nil, fmt.Errorf("%s: schema %d is newer than this moat's %d", filepath.Join(dir, RecordFile), r.Schema, Schema)
	}
	return &r, nil
}

// Save writes r to dir, replacing the old record at once.
func (r *Record) Save(dir string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, RecordFile+".tmp")
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("writing the docker record: %w", err)
	}
	return os.Rename(tmp, filepath.Join(dir, RecordFile))
}

// RuntimeEnv names the variable that picks a new sandbox's workload
// runtime ("runsc" or "runc"; unset: runsc when Docker has it, else
// runc). moat passes it on to moat-docker, which reads it when the
// sandbox is made; the record keeps the choice.
const RuntimeEnv = "MOAT_DOCKER_RUNTIME"

// ChooseRuntime is the workload's runtime for a new sandbox: want is
// RuntimeEnv's value, hasRunsc whether Docker has runsc registered.
func ChooseRuntime(want string, hasRunsc bool) (string, error) {
	switch want {
	case "":
		if hasRunsc {
			return "runsc", nil
		}
		return "runc", nil
	case "runc":
		return "runc", nil
	case "runsc":
		if !hasRunsc {
			return "", fmt.Errorf("%s=runsc, but Docker has no runtime named runsc; register it (see: moat doctor) or unset %s", RuntimeEnv, RuntimeEnv)
		}
		return "runsc", nil
	}
	return "", fmt.Errorf("%s=%q: want runsc or runc, or leave it unset for runsc when Docker has it", RuntimeEnv, want)
}

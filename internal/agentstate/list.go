package agentstate

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Project is a project with kept state.
type Project struct {
	ID        string
	Workspace string // "" when not recorded
}

// Projects lists the projects with kept state.
func (s Store) Projects() ([]Project, error) {
	ents, err := os.ReadDir(s.State)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Project
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".git")
		if !ok || !e.IsDir() {
			continue
		}
		b, _ := os.ReadFile(filepath.Join(s.State, e.Name(), workspaceFile))
		out = append(out, Project{ID: id, Workspace: strings.TrimSpace(string(b))})
	}
	return out, nil
}

// Conversation is one kept transcript.
type Conversation struct {
	Project string
	Agent   string // claude | codex
	ID      string // the file's name without .jsonl: Claude Code's session id
	Path    string // in the repository: AGENT/...
	Size    int64
	// Time is when the last commit that changed it was made.
	Time time.Time
	// Sandbox is the sandbox whose branch last changed it.
	Sandbox string
}

// isConversation says whether a repository path is a transcript:
// claude/projects/DIR/ID.jsonl, codex/sessions/.../ID.jsonl.
func isConversation(p string) (agent string, ok bool) {
	if !strings.HasSuffix(p, ".jsonl") {
		return "", false
	}
	f := strings.Split(p, "/")
	switch {
	case len(f) == 4 && f[0] == "claude" && f[1] == "projects":
		return "claude", true
	case len(f) >= 3 && f[0] == "codex" && f[1] == "sessions":
		return "codex", true
	}
	return "", false
}

// Conversations lists project's transcripts, newest first, after
// committing and merging every sandbox directory of the project (so a
// running sandbox's show too).
func (s Store) Conversations(project string) ([]Conversation, error) {
	r, unlock, err := s.open(project, "", false)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if err := s.syncAll(r, project); err != nil {
		s.note(err.Error())
	}
	mt, err := r.tip(mainRef)
	if err != nil || mt == "" {
		return nil, err
	}
	files, err := r.tree(mt)
	if err != nil {
		return nil, err
	}
	last, err := r.lastChanges(mt)
	if err != nil {
		return nil, err
	}
	var out []Conversation
	for p, e := range files {
		agent, ok := isConversation(p)
		if !ok {
			continue
		}
		c := last[p]
		c.Project, c.Agent, c.Path, c.Size = project, agent, p, e.size
		c.ID = strings.TrimSuffix(path.Base(p), ".jsonl")
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Time.Equal(out[j].Time) {
			return out[i].Time.After(out[j].Time)
		}
		return out[i].Path < out[j].Path
	})
	return out, nil
}

// lastChanges maps each path to the time and sandbox of the newest
// sandbox commit (merges left out) that changed it.
func (r repo) lastChanges(rev string) (map[string]Conversation, error) {
	out, err := r.git(nil, "log", "--no-merges", "--format=@@%ct %s", "--name-only", rev)
	if err != nil {
		return nil, err
	}
	m := map[string]Conversation{}
	var cur Conversation
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "@@"); ok {
			ts, subject, _ := strings.Cut(rest, " ")
			sec, _ := strconv.ParseInt(ts, 10, 64)
			cur = Conversation{Time: time.Unix(sec, 0).UTC(), Sandbox: strings.TrimPrefix(subject, "sandbox ")}
			continue
		}
		if line == "" {
			continue
		}
		if _, ok := m[line]; !ok {
			m[line] = cur
		}
	}
	return m, sc.Err()
}

// Find is the conversation of project whose ID or path is id.
func (s Store) Find(project, id string) (Conversation, error) {
	cs, err := s.Conversations(project)
	if err != nil {
		return Conversation{}, err
	}
	var found []Conversation
	for _, c := range cs {
		if c.ID == id || c.Path == id || strings.HasPrefix(c.ID, id) {
			found = append(found, c)
		}
	}
	switch len(found) {
	case 0:
		return Conversation{}, fmt.Errorf("%s: %w", id, ErrNoConversation)
	case 1:
		return found[0], nil
	}
	return Conversation{}, fmt.Errorf("%q matches %d conversations (%s, %s, ...); give more of the id", id, len(found), found[0].ID, found[1].ID)
}

// ErrNoConversation is returned for an id no conversation has.
var ErrNoConversation = errors.New("no such conversation")

// Details are what a transcript says about itself.
type Details struct {
	Conversation
	Lines int
	// First and Last are the earliest and latest "timestamp" the lines
	// carry (Claude Code's; Codex's rollouts have them too).
	First, Last time.Time
	Cwd         string // the directory it ran in ("" if none said)
	Version     string // the agent's version ("" if none said)
}

// Show reads c's transcript for its details.
func (s Store) Show(c Conversation) (Details, error) {
	d := Details{Conversation: c}
	r, unlock, err := s.open(c.Project, "", false)
	if err != nil {
		return d, err
	}
	defer unlock()
	files, err := r.tree(mainRef)
	if err != nil {
		return d, err
	}
	e, ok := files[c.Path]
	if !ok {
		return d, fmt.Errorf("%s: %w", c.ID, ErrNoConversation)
	}
	blobs, err := r.blobs([]string{e.sha})
	if err != nil {
		return d, err
	}
	for _, line := range bytes.Split(blobs[e.sha], []byte{'\n'}) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		d.Lines++
		var m struct {
			Timestamp string `json:"timestamp"`
			Cwd       string `json:"cwd"`
			Version   string `json:"version"`
			Payload   struct {
				Cwd string `json:"cwd"`
			} `json:"payload"`
		}
		if json.Unmarshal(line, &m) != nil {
			continue
		}
		if t, err := time.Parse(time.RFC3339Nano, m.Timestamp); err == nil {
			if d.First.IsZero() || t.Before(d.First) {
				d.First = t
			}
			if t.After(d.Last) {
				d.Last = t
			}
		}
		if d.Cwd == "" {
			d.Cwd = m.Cwd
			if d.Cwd == "" {
				d.Cwd = m.Payload.Cwd
			}
		}
		if d.Version == "" {
			d.Version = m.Version
		}
	}
	return d, nil
}

// Delete removes c from the project's main line, with what belongs to
// it (Claude Code's projects/DIR/ID/ directory of subagent transcripts,
// its todos/ID-*.json). Sandbox directories lose it at their next start;
// a running sandbox that still writes to it brings it back when it stops.
func (s Store) Delete(c Conversation) error {
	r, unlock, err := s.open(c.Project, "", false)
	if err != nil {
		return err
	}
	defer unlock()
	mt, err := r.tip(mainRef)
	if err != nil || mt == "" {
		return err
	}
	files, err := r.tree(mt)
	if err != nil {
		return err
	}
	dir := strings.TrimSuffix(c.Path, ".jsonl") + "/"
	gone := func(p string) bool {
		return p == c.Path || strings.HasPrefix(p, dir) ||
			(c.Agent == "claude" && strings.HasPrefix(p, "claude/todos/"+c.ID+"-"))
	}
	var keep []file
	for p, e := range files {
		if !gone(p) {
			keep = append(keep, file{path: p, sha: e.sha})
		}
	}
	if len(keep) == len(files) {
		return fmt.Errorf("%s: %w", c.ID, ErrNoConversation)
	}
	sort.Slice(keep, func(i, j int) bool { return keep[i].path < keep[j].path })
	return r.commit(mainRef, mt, "", "remove "+c.ID, keep, s.now())
}

package policy

import "fmt"

// builtin is the "default" named policy: what a coding agent needs on a
// normal day, and nothing that only looks convenient. Each entry says why
// it is here. Names only, no ports: git over SSH to a code host needs 22
// as much as HTTPS needs 443.
//
// Three kinds of host are deliberately absent: the Go module proxy and
// checksum database, the Debian package mirrors and the npm registry.
// Which of those a sandbox uses depends on its image and the host's
// configuration (GOPROXY, sources.list, npmrc), so Discover reads them
// from there instead of this list guessing.
var builtin = []struct{ entry, why string }{
	// AI model APIs: the agent in the sandbox talks to its model.
	{"api.anthropic.com", "Claude API"},
	{"claude.ai", "Claude Code checks a domain here before its WebFetch tool fetches it"},
	// statsig.anthropic.com and sentry.io (Claude Code's telemetry and
	// error reports) are left out: the agent works without them, and
	// a sandbox should not report home by default.
	{"api.openai.com", "OpenAI API (Codex CLI and others)"},
	{"generativelanguage.googleapis.com", "Gemini API"},
	{"api.mistral.ai", "Mistral API"},
	{"api.deepseek.com", "DeepSeek API"},
	{"api.x.ai", "xAI (Grok) API"},
	{"api.groq.com", "Groq API"},
	{"openrouter.ai", "OpenRouter: one API in front of many models"},

	// Code hosts, with the hosts their git and release downloads use.
	{"github.com", "git over HTTPS and SSH, web pages agents read"},
	{"api.github.com", "the GitHub API: gh, and tools that resolve releases"},
	{"codeload.github.com", "archive downloads (tarball and zipball links)"},
	{"objects.githubusercontent.com", "release assets and LFS objects (redirect target)"},
	{"release-assets.githubusercontent.com", "release assets (the newer redirect target)"},
	{"raw.githubusercontent.com", "single files: install scripts, raw sources"},
	{"gitlab.com", "git and API"},
	{"bitbucket.org", "git and web"},
	{"api.bitbucket.org", "Bitbucket API"},

	// Language package registries; the Go, Debian and npm ones are
	// discovered (see above).
	{"pypi.org", "Python package index (pip's simple API)"},
	{"files.pythonhosted.org", "Python package files, where pypi.org links point"},
	{"crates.io", "Rust registry API (cargo publish, search)"},
	{"index.crates.io", "Rust sparse index, cargo's default since 1.70"},
	{"static.crates.io", "Rust crate downloads"},
	{"rubygems.org", "Ruby gems and their downloads"},
	{"index.rubygems.org", "Bundler's compact index"},
	{"repo.maven.apache.org", "Maven Central, Maven's default"},
	{"repo1.maven.org", "Maven Central under the name Gradle and older tools use"},
	{"plugins.gradle.org", "Gradle plugin portal"},
	{"services.gradle.org", "Gradle distributions the gradle wrapper downloads"},
	{"repo.packagist.org", "PHP Composer metadata"},
	{"api.nuget.org", ".NET NuGet feed"},
	{"repo.hex.pm", "Elixir/Erlang Hex packages"},
	{"pub.dev", "Dart and Flutter packages"},
}

// Builtin returns the "default" named policy as allow rules (layer
// LayerNamed, source "policy default"). It panics if an entry does not
// parse, which the tests rule out.
func Builtin() []Rule {
	out := make([]Rule, 0, len(builtin))
	for _, b := range builtin {
		r, err := ParseEntry(b.entry)
		if err != nil {
			panic(fmt.Sprintf("policy: built-in entry: %v", err))
		}
		r.Action, r.Layer, r.Source = Allow, LayerNamed, "policy default"
		out = append(out, r)
	}
	return out
}

// Command luahealth runs Argo CD resource health scripts (health.lua) the way Argo CD runs
// them, so the scripts in charts/argocd are tested by the interpreter Argo CD embeds and
// nothing else.
//
// The argo-cd module cannot be built here (the module proxy refuses its gitops-engine
// dependency), so this program reproduces what Argo CD v3.5.7 does around the interpreter,
// with the same modules at the same versions (go.mod):
//
//   - util/lua/lua.go, VM.runLuaWithResourceActionParameters: lua.NewState with
//     SkipOpenLibs = !UseOpenLibs; then package, base, table and Argo CD's "safe" os library
//     are opened; `os` is also preloaded for require("os"); a 1 s context deadline; the
//     globals `actionParams` (empty for health) and `obj` (the live object, converted by
//     decodeValue); DoString(script); a runtime error loses its Lua stack trace.
//   - util/lua/lua.go, VM.ExecuteHealthLua: the value left on the stack is encoded to JSON by
//     layeh.com/gopher-json and decoded into {status, message}; an empty table (encoded as
//     `[]`) is an empty status; a status outside Unknown, Progressing, Suspended, Healthy,
//     Degraded, Missing becomes Unknown "Lua returned an invalid health status"; nil is an
//     empty status; anything else is an error.
//   - util/lua/health_test.go, TestLuaHealthScript: every health.lua under a
//     resource_customizations tree has a health_test.yaml of
//     `tests: [{healthStatus: {status, message}, inputPath}]`; each input is read with
//     sigs.k8s.io/yaml, its script is found by the input's own group/kind
//     (<group>/<kind>/health.lua, as VM.GetHealthScript finds built-in scripts), run with
//     UseOpenLibs = true, and the result must equal healthStatus exactly.
//   - util/settings/settings.go, appendResourceOverridesFromSplitKeys: an argocd-cm key
//     resource.customizations.<type>.<group>_<kind>; `health` holds the script and
//     `useOpenLibs` whether the standard libraries are opened (false unless set).
//   - gitops-engine pkg/health, GetResourceHealth: an object being deleted is Progressing
//     "Pending deletion" before any script runs; a script error is Unknown with the error.
//
// A script shipped in argocd-cm runs with UseOpenLibs = false (no string, math, io or os
// globals), while Argo CD's own test runs it with true: `test` runs every case both ways.
//
//	luahealth test DIR                  run every health_test.yaml under DIR (a
//	                                    resource_customizations tree); one JSON line per case
//	                                    and mode; exit 1 when one fails
//	luahealth eval -argocd-cm CM FILE.. the health Argo CD computes for each object (a YAML or
//	                                    JSON object, or a List) with the scripts of the
//	                                    argocd-cm ConfigMap in CM; one JSON line per object
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"

	lua "github.com/yuin/gopher-lua"
	luajson "layeh.com/gopher-json"
	"sigs.k8s.io/yaml"
)

// healthStatus has the JSON shape of gitops-engine's health.HealthStatus.
type healthStatus struct {
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
}

const (
	incorrectReturnType = "expect %s output from Lua script, not %s"
	invalidHealthStatus = "Lua returned an invalid health status"
	healthScriptFile    = "health.lua"
)

var validHealthStatus = map[string]bool{
	"Unknown": true, "Progressing": true, "Suspended": true, "Healthy": true,
	"Degraded": true, "Missing": true,
}

// safeOsFuncs is Argo CD's os subset (util/lua/oslib_safe.go): time and date only. Argo CD's
// are copies of gopher-lua's own two functions, which are taken here from gopher-lua itself.
var safeOsFuncs = func() map[string]lua.LGFunction {
	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	if err := l.CallByParam(lua.P{Fn: l.NewFunction(lua.OpenOs), NRet: 1, Protect: true},
		lua.LString(lua.OsLibName)); err != nil {
		panic(err)
	}
	full := l.Get(-1).(*lua.LTable)
	funcs := map[string]lua.LGFunction{}
	for _, name := range []string{"time", "date"} {
		funcs[name] = full.RawGetString(name).(*lua.LFunction).GFunction
	}
	return funcs
}()

// openSafeOs is Argo CD's OpenSafeOs, reproduced as is: it registers under lua.TabLibName,
// and since the table module is already loaded gopher-lua leaves it unchanged. So a script
// sees a global `os` only when the standard libraries are open (gopher-lua's full one), and
// require("os") gives the time/date subset either way.
func openSafeOs(l *lua.LState) int {
	tabmod := l.RegisterModule(lua.TabLibName, safeOsFuncs)
	l.Push(tabmod)
	return 1
}

// safeOsLoader is Argo CD's SafeOsLoader, behind require("os").
func safeOsLoader(l *lua.LState) int {
	mod := l.SetFuncs(l.NewTable(), safeOsFuncs)
	l.Push(mod)
	return 1
}

// decodeValue is Argo CD's conversion of the object into Lua values.
func decodeValue(l *lua.LState, value any) lua.LValue {
	switch converted := value.(type) {
	case bool:
		return lua.LBool(converted)
	case float64:
		return lua.LNumber(converted)
	case string:
		return lua.LString(converted)
	case json.Number:
		return lua.LString(converted)
	case int:
		return lua.LNumber(converted)
	case int32:
		return lua.LNumber(converted)
	case int64:
		return lua.LNumber(converted)
	case []any:
		arr := l.CreateTable(len(converted), 0)
		for _, item := range converted {
			arr.Append(decodeValue(l, item))
		}
		return arr
	case map[string]any:
		tbl := l.CreateTable(0, len(converted))
		for key, item := range converted {
			tbl.RawSetH(lua.LString(key), decodeValue(l, item))
		}
		return tbl
	}
	return lua.LNil
}

func runLua(obj map[string]any, script string, useOpenLibs bool) (*lua.LState, error) {
	l := lua.NewState(lua.Options{SkipOpenLibs: !useOpenLibs})
	// Argo CD closes the state here too and reads the result after; Close only releases the
	// state's resources, the stack stays readable.
	defer l.Close()
	for _, pair := range []struct {
		n string
		f lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.OsLibName, openSafeOs},
	} {
		if err := l.CallByParam(lua.P{Fn: l.NewFunction(pair.f), NRet: 0, Protect: true},
			lua.LString(pair.n)); err != nil {
			return nil, err
		}
	}
	l.PreloadModule(lua.OsLibName, safeOsLoader)

	ctx, cancel := context.WithTimeout(context.Background(), 1*time.Second)
	defer cancel()
	l.SetContext(ctx)

	l.SetGlobal("actionParams", l.CreateTable(0, 0))
	l.SetGlobal("obj", decodeValue(l, obj))
	err := l.DoString(script)

	var apiErr *lua.ApiError
	if errors.As(err, &apiErr) && apiErr.Type == lua.ApiErrorRun {
		apiErr.StackTrace = ""
		err = apiErr
	}
	return l, err
}

func executeHealthLua(obj map[string]any, script string, useOpenLibs bool) (*healthStatus, error) {
	l, err := runLua(obj, script, useOpenLibs)
	if err != nil {
		return nil, err
	}
	returnValue := l.Get(-1)
	switch returnValue.Type() {
	case lua.LTTable:
		jsonBytes, err := luajson.Encode(returnValue)
		if err != nil {
			return nil, err
		}
		result := &healthStatus{}
		if err := json.Unmarshal(jsonBytes, result); err != nil {
			typeError := &json.UnmarshalTypeError{Value: "array", Type: reflect.TypeFor[*healthStatus]()}
			if errors.As(err, &typeError) {
				return &healthStatus{}, nil
			}
			return nil, err
		}
		if !validHealthStatus[result.Status] {
			return &healthStatus{Status: "Unknown", Message: invalidHealthStatus}, nil
		}
		return result, nil
	case lua.LTNil:
		return &healthStatus{}, nil
	}
	return nil, fmt.Errorf(incorrectReturnType, "table", returnValue.Type().String())
}

// configMapKey is Argo CD's GetConfigMapKey: "<group>/<kind>", or "<kind>" for the core group.
func configMapKey(obj map[string]any) string {
	apiVersion, _ := obj["apiVersion"].(string)
	kind, _ := obj["kind"].(string)
	group := ""
	if i := strings.Index(apiVersion, "/"); i >= 0 {
		group = apiVersion[:i]
	}
	if group == "" {
		return kind
	}
	return group + "/" + kind
}

// --- luahealth test ------------------------------------------------------------------------

type testFile struct {
	Tests []struct {
		InputPath    string       `json:"inputPath"`
		HealthStatus healthStatus `json:"healthStatus"`
	} `json:"tests"`
}

type caseResult struct {
	Case     string        `json:"case"`
	Mode     string        `json:"mode"`
	OK       bool          `json:"ok"`
	Expected healthStatus  `json:"expected"`
	Got      *healthStatus `json:"got,omitempty"`
	Error    string        `json:"error,omitempty"`
}

// modes: how Argo CD's own test runs a script, and how an argocd-cm entry runs by default.
var modes = []struct {
	name        string
	useOpenLibs bool
}{{"argocd-test", true}, {"argocd-cm", false}}

func runTests(root string, out io.Writer) (failed int, err error) {
	root = filepath.Clean(root)
	var dirs []string
	err = filepath.Walk(root, func(path string, _ os.FileInfo, walkErr error) error {
		if walkErr != nil {
			return walkErr
		}
		if filepath.Base(path) == healthScriptFile {
			dirs = append(dirs, filepath.Dir(path))
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if len(dirs) == 0 {
		return 0, fmt.Errorf("no %s under %s", healthScriptFile, root)
	}
	sort.Strings(dirs)
	encoder := json.NewEncoder(out)
	for _, dir := range dirs {
		raw, err := os.ReadFile(filepath.Join(dir, "health_test.yaml"))
		if err != nil {
			return failed, err
		}
		var tests testFile
		if err := yaml.Unmarshal(raw, &tests); err != nil {
			return failed, fmt.Errorf("%s/health_test.yaml: %w", dir, err)
		}
		if len(tests.Tests) == 0 {
			return failed, fmt.Errorf("%s/health_test.yaml has no tests", dir)
		}
		for _, test := range tests.Tests {
			name := filepath.Join(strings.TrimPrefix(dir, root+string(filepath.Separator)), test.InputPath)
			for _, mode := range modes {
				result := caseResult{Case: name, Mode: mode.name, Expected: test.HealthStatus}
				got, err := runCase(root, filepath.Join(dir, test.InputPath), mode.useOpenLibs)
				if err != nil {
					result.Error = err.Error()
				} else {
					result.Got = got
					result.OK = *got == test.HealthStatus
				}
				if !result.OK {
					failed++
				}
				if err := encoder.Encode(result); err != nil {
					return failed, err
				}
			}
		}
	}
	return failed, nil
}

func runCase(root, inputPath string, useOpenLibs bool) (*healthStatus, error) {
	raw, err := os.ReadFile(inputPath)
	if err != nil {
		return nil, err
	}
	obj := map[string]any{}
	if err := yaml.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	script, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(configMapKey(obj)), healthScriptFile))
	if err != nil {
		return nil, fmt.Errorf("no built-in script for %s: %w", configMapKey(obj), err)
	}
	return executeHealthLua(obj, string(script), useOpenLibs)
}

// --- luahealth eval ------------------------------------------------------------------------

type override struct {
	healthLua   string
	useOpenLibs bool
}

// loadOverrides reads the resource.customizations.<type>.<group_kind> keys of an argocd-cm.
func loadOverrides(path string) (map[string]override, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cm struct {
		Kind string            `json:"kind"`
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		return nil, err
	}
	if cm.Kind != "ConfigMap" {
		return nil, fmt.Errorf("%s: kind %q, want ConfigMap", path, cm.Kind)
	}
	overrides := map[string]override{}
	for k, v := range cm.Data {
		if !strings.HasPrefix(k, "resource.customizations.") {
			continue
		}
		parts := strings.SplitN(k, ".", 4)
		if len(parts) < 4 {
			continue
		}
		groupKind := strings.Split(parts[3], "_")
		var key string
		switch {
		case len(groupKind) == 2:
			key = groupKind[0] + "/" + groupKind[1]
		case len(groupKind) == 1 && parts[3] != "":
			key = parts[3]
		default:
			return nil, fmt.Errorf("group kind should be in format `resource.customizations.<type>.<group_kind>`, got %q", parts[3])
		}
		o := overrides[key]
		switch parts[2] {
		case "health":
			o.healthLua = v
		case "useOpenLibs":
			switch strings.ToLower(v) {
			case "1", "t", "true":
				o.useOpenLibs = true
			case "0", "f", "false":
				o.useOpenLibs = false
			default:
				return nil, fmt.Errorf("%s: not a bool: %q", k, v)
			}
		case "actions", "ignoreDifferences", "ignoreResourceUpdates", "knownTypeFields":
		default:
			return nil, fmt.Errorf("resource customization type %s not supported", parts[2])
		}
		overrides[key] = o
	}
	return overrides, nil
}

// readObjects reads one object or a List, with integers as int64 as the API machinery's
// unstructured decoding gives them to Argo CD's controller.
func readObjects(path string) ([]map[string]any, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	jsonBytes, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return nil, err
	}
	decoder := json.NewDecoder(bytes.NewReader(jsonBytes))
	decoder.UseNumber()
	var obj map[string]any
	if err := decoder.Decode(&obj); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	obj = convertNumbers(obj).(map[string]any)
	if items, ok := obj["items"].([]any); ok && strings.HasSuffix(fmt.Sprint(obj["kind"]), "List") {
		objects := make([]map[string]any, 0, len(items))
		for _, item := range items {
			objects = append(objects, item.(map[string]any))
		}
		return objects, nil
	}
	return []map[string]any{obj}, nil
}

func convertNumbers(value any) any {
	switch v := value.(type) {
	case map[string]any:
		for key, item := range v {
			v[key] = convertNumbers(item)
		}
		return v
	case []any:
		for i, item := range v {
			v[i] = convertNumbers(item)
		}
		return v
	case json.Number:
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	}
	return value
}

type evalResult struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	healthStatus
	Error string `json:"error,omitempty"`
}

func resourceHealth(obj map[string]any, overrides map[string]override) (*healthStatus, error) {
	meta, _ := obj["metadata"].(map[string]any)
	if meta != nil && meta["deletionTimestamp"] != nil {
		return &healthStatus{Status: "Progressing", Message: "Pending deletion"}, nil
	}
	o, ok := overrides[configMapKey(obj)]
	if !ok || o.healthLua == "" {
		return nil, nil
	}
	result, err := executeHealthLua(obj, o.healthLua, o.useOpenLibs)
	if err != nil {
		return &healthStatus{Status: "Unknown", Message: err.Error()}, err
	}
	return result, nil
}

func runEval(configMap string, files []string, out io.Writer) error {
	overrides, err := loadOverrides(configMap)
	if err != nil {
		return err
	}
	encoder := json.NewEncoder(out)
	for _, file := range files {
		objects, err := readObjects(file)
		if err != nil {
			return err
		}
		for _, obj := range objects {
			meta, _ := obj["metadata"].(map[string]any)
			result := evalResult{Kind: fmt.Sprint(obj["kind"])}
			if meta != nil {
				result.Name, _ = meta["name"].(string)
				result.Namespace, _ = meta["namespace"].(string)
			}
			health, err := resourceHealth(obj, overrides)
			if err != nil {
				result.Error = err.Error()
			}
			if health != nil {
				result.healthStatus = *health
			}
			if err := encoder.Encode(result); err != nil {
				return err
			}
		}
	}
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: luahealth test DIR | luahealth eval -argocd-cm CM FILE...")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "test":
		if len(os.Args) != 3 {
			fmt.Fprintln(os.Stderr, "usage: luahealth test DIR")
			os.Exit(2)
		}
		failed, err := runTests(os.Args[2], os.Stdout)
		if err != nil {
			fmt.Fprintln(os.Stderr, "luahealth:", err)
			os.Exit(2)
		}
		if failed > 0 {
			fmt.Fprintf(os.Stderr, "luahealth: %d case(s) failed\n", failed)
			os.Exit(1)
		}
	case "eval":
		flags := flag.NewFlagSet("eval", flag.ExitOnError)
		configMap := flags.String("argocd-cm", "", "the argocd-cm ConfigMap (YAML)")
		_ = flags.Parse(os.Args[2:])
		if *configMap == "" || flags.NArg() == 0 {
			fmt.Fprintln(os.Stderr, "usage: luahealth eval -argocd-cm CM FILE...")
			os.Exit(2)
		}
		if err := runEval(*configMap, flags.Args(), os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "luahealth:", err)
			os.Exit(2)
		}
	default:
		fmt.Fprintf(os.Stderr, "luahealth: unknown command %q\n", os.Args[1])
		os.Exit(2)
	}
}

package middleware

// View image. Boundary: tool call (view_image), model call (request only),
// state. Provides the view_image tool when the run has a workdir: it reads
// an image (PNG, JPEG, GIF or WebP, told by its bytes, not its name) of at
// most max_bytes, and records only its metadata (path, type, size,
// sha256) in the state value "viewed_images" and in the tool result's
// Meta. Before the next model call it puts the images of the last tool
// batch into that one request, as a trailing user message with image
// parts (data URLs) when the model sees images, or a text placeholder
// when it does not (a model configured without vision never does). The bytes are read again for the request and never
// enter state, so no checkpoint holds an image (deer-flow #4138); a file
// that changed since it was viewed is skipped with a note. A provider
// that refuses the images (400 or 422) gets the call once more with the
// placeholder, and the model the placeholder for the rest of the process.
// Emits nothing; logs, once per model, a guess by the model's name and a
// refusal.

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/natsagent/natsagent/internal/files"
	"github.com/natsagent/natsagent/internal/model"
	"github.com/natsagent/natsagent/internal/state"
	"github.com/natsagent/natsagent/internal/tools"
)

// ViewImageTool is the name of the tool the view_image middleware
// provides.
const ViewImageTool = "view_image"

// ViewedImagesValue is the state value listing the images viewed (a list
// of ViewedImage, latest last).
const ViewedImagesValue = "viewed_images"

// MetaViewedImage marks a view_image result; its value is a ViewedImage.
const MetaViewedImage = "viewed_image"

// DefaultMaxImageBytes bounds an image view_image reads.
const DefaultMaxImageBytes = 20 << 20

// maxViewedImages bounds the viewed_images list; the oldest go first.
const maxViewedImages = 100

// ViewedImage is what state keeps of a viewed image: never its bytes.
type ViewedImage struct {
	Path   string `json:"path"`
	MIME   string `json:"mime"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// ViewImage lets the model look at images of the workdir.
type ViewImage struct {
	// Vision says whether the model sees images; unset, the model's name
	// decides (VisionModel).
	Vision *bool `json:"vision"`
	// MaxBytes bounds an image (default 20 MiB).
	MaxBytes int64 `json:"max_bytes"`
}

// NewViewImage fills defaults and checks the settings.
func NewViewImage(v ViewImage) (*ViewImage, error) {
	if v.MaxBytes == 0 {
		v.MaxBytes = DefaultMaxImageBytes
	}
	if v.MaxBytes < 0 || v.MaxBytes > 100<<20 {
		return nil, fmt.Errorf("max_bytes must be 1 to %d, not %d", 100<<20, v.MaxBytes)
	}
	return &v, nil
}

// Name implements Middleware.
func (*ViewImage) Name() string { return "view_image" }

// visionModels are parts of model names known to take image input. The
// list is short on purpose: a model missing from it gets the placeholder
// until its profile says vision: true.
var visionModels = []string{
	"gpt-4o", "gpt-4.1", "gpt-4-turbo", "gpt-5",
	"claude-3", "claude-sonnet-4", "claude-opus-4", "claude-haiku-4",
	"gemini", "pixtral", "llava", "-vl", "vision",
}

// VisionModel reports whether a model name is one known to see images.
func VisionModel(name string) bool {
	name = strings.ToLower(name)
	for _, v := range visionModels {
		if strings.Contains(name, v) {
			return true
		}
	}
	return false
}

// vision says whether the run's model is shown images: never when the
// run's model takes no image input (Runtime.NoImages: the profile's or
// models[].vision false, which the loop enforces anyway) or its provider
// refused an image in this process, else as the middleware's vision says,
// else by the model's name (logged once per model: LogVisionGuess).
func (v *ViewImage) vision(rt *Runtime, modelName string) bool {
	if rt.NoImages {
		return false
	}
	if _, refused := refusedImages.Load(modelName); refused {
		return false
	}
	if v.Vision != nil {
		return *v.Vision
	}
	sees := VisionModel(modelName)
	LogVisionGuess(rt.Logger, modelName, sees)
	return sees
}

// VisionUnset reports whether view_image decides by the model's name
// whether it sees images (its vision is not set).
func (v *ViewImage) VisionUnset() bool { return v.Vision == nil }

// refusedImages holds the models (by name) whose provider refused an
// image view_image sent, in this process: they get the placeholder from
// then on. guessLogged holds the models whose guess was logged.
var refusedImages, guessLogged sync.Map

// LogVisionGuess logs, once per model and process, that view_image
// decides by modelName whether the model sees images, and how to say it
// instead: a wrong guess either way is otherwise silent (a model shown no
// image, or a provider refusing one). The worker logs the guesses of its
// profiles' models when it starts; a run on another model logs its own.
func LogVisionGuess(log *zap.Logger, modelName string, sees bool) {
	if log == nil || modelName == "" {
		return
	}
	if _, logged := guessLogged.LoadOrStore(modelName, struct{}{}); logged {
		return
	}
	log.Info("view_image guessed from the model's name whether it sees images; "+
		"say it with vision: true or false on the model's models entry (or view_image's vision)",
		zap.String("model", modelName), zap.Bool("sees_images", sees))
}

// refusedImageInput reports a provider's refusal of a request as invalid
// (400, or 422 as some providers say it): of a request with images, most
// likely because its model takes no image input.
func refusedImageInput(err error) bool {
	var apiErr *model.APIError
	return errors.As(err, &apiErr) && (apiErr.StatusCode == http.StatusBadRequest || apiErr.StatusCode == http.StatusUnprocessableEntity)
}

var viewImageSpec = model.ToolSpec{
	Name: ViewImageTool,
	Description: "Looks at an image file of the workdir (PNG, JPEG, GIF or WebP). " +
		"The image is shown to you with your next request.",
	Parameters: tools.SchemaJSON[viewImageArgs](),
}

type viewImageArgs struct {
	Path string `json:"path" jsonschema:"Path of the image in the workdir, such as /uploads/chart.png"`
}

// viewRun is a run's view_image memory: the model of its latest call and
// what its views recorded.
type viewRun struct {
	mu        sync.Mutex
	modelName string
	known     []ViewedImage
}

func (v *ViewImage) run(rt *Runtime) *viewRun {
	return Scratch(rt, "view_image", func() *viewRun { return &viewRun{} })
}

// WrapModelCall offers view_image and shows the last batch's images.
func (v *ViewImage) WrapModelCall(ctx context.Context, rt *Runtime, req *ModelRequest, next ModelHandler) (*ModelResponse, error) {
	vr := v.run(rt)
	vr.mu.Lock()
	vr.modelName = req.ModelName
	vr.mu.Unlock()
	r := *req
	if rt.Files != nil && !slices.ContainsFunc(req.Tools, func(s model.ToolSpec) bool { return s.Name == ViewImageTool }) {
		r.Tools = withTools(req.Tools, viewImageSpec)
	}
	shown := batchImages(req.Messages)
	if len(shown) == 0 {
		return next(ctx, &r)
	}
	msg := v.imageMessage(ctx, rt.Files, shown, v.vision(rt, req.ModelName))
	r.Messages = append(slices.Clip(req.Messages), msg)
	resp, err := next(ctx, &r)
	if len(msg.Parts) == 0 || !refusedImageInput(err) {
		return resp, err
	}
	// The provider refused the request with the images: once more with
	// the placeholder. Remembered for the process only when that one is
	// taken, so a request refused for another reason changes nothing.
	retry := r
	retry.Messages = append(slices.Clip(req.Messages), v.imageMessage(ctx, rt.Files, shown, false))
	resp, err2 := next(ctx, &retry)
	if err2 != nil {
		return nil, err2
	}
	if _, known := refusedImages.LoadOrStore(req.ModelName, struct{}{}); !known && rt.Logger != nil {
		rt.Logger.Warn("the model's provider refused image input: view_image sends it a placeholder from now on; "+
			"say vision: false on the model's models entry (or view_image's vision) to skip the refused call",
			zap.String("model", req.ModelName), zap.Error(err))
	}
	return resp, nil
}

// batchImages returns the images viewed by the tool results after the
// last assistant message, one per path (the latest), in call order.
func batchImages(msgs []model.Message) []ViewedImage {
	var out []ViewedImage
	for i := len(msgs) - 1; i >= 0; i-- {
		m := msgs[i]
		if m.Role == model.RoleAssistant {
			break
		}
		var img ViewedImage
		if m.Role != model.RoleTool || m.Status == model.ToolStatusError || !metaAs(m.Meta[MetaViewedImage], &img) || img.Path == "" {
			continue
		}
		if !slices.ContainsFunc(out, func(o ViewedImage) bool { return o.Path == img.Path }) {
			out = append(out, img)
		}
	}
	slices.Reverse(out)
	return out
}

// imageMessage is the request-only user message carrying the images, or
// the placeholder for a model that cannot see them.
func (v *ViewImage) imageMessage(ctx context.Context, wd files.Workdir, imgs []ViewedImage, vision bool) model.Message {
	msg := model.Message{Role: model.RoleUser, Name: v.Name()}
	if !vision {
		var b strings.Builder
		b.WriteString("You viewed these images, but the current model cannot see images, so their content is not available to you:")
		for _, img := range imgs {
			fmt.Fprintf(&b, "\n- %s (%s, %d bytes)", img.Path, img.MIME, img.Size)
		}
		b.WriteString("\nDo not guess what they show; say that you cannot see them if it matters.")
		msg.Content = b.String()
		return msg
	}
	var text []string
	add := func(s string) {
		text = append(text, s)
		msg.Parts = append(msg.Parts, model.Part{Type: model.PartText, Text: s})
	}
	add("Here are the images you viewed with view_image:")
	shown := 0
	for _, img := range imgs {
		data, err := v.reread(ctx, wd, img)
		if err != nil {
			add(fmt.Sprintf("- %s: not shown: %v.", img.Path, err))
			continue
		}
		add(fmt.Sprintf("- %s (%s):", img.Path, img.MIME))
		msg.Parts = append(msg.Parts, model.Part{
			Type:     model.PartImageURL,
			ImageURL: "data:" + img.MIME + ";base64," + base64.StdEncoding.EncodeToString(data),
		})
		shown++
	}
	msg.Content = strings.Join(text, "\n")
	if shown == 0 {
		msg.Parts = nil // text only: nothing to show
	}
	return msg
}

var errChanged = errors.New("the file changed since you viewed it; call view_image again to see it as it is now")

// reread reads a viewed image again and checks it is the one viewed.
func (v *ViewImage) reread(ctx context.Context, wd files.Workdir, img ViewedImage) ([]byte, error) {
	if wd == nil {
		return nil, tools.ErrNoWorkdir
	}
	info, err := wd.Stat(ctx, img.Path)
	if err != nil {
		return nil, err
	}
	if info.IsDir || info.Size != img.Size || info.Size > v.MaxBytes {
		return nil, errChanged
	}
	data, err := wd.Read(ctx, img.Path)
	if err != nil {
		return nil, err
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != img.SHA256 {
		return nil, errChanged
	}
	return data, nil
}

// WrapToolCall runs view_image.
func (v *ViewImage) WrapToolCall(ctx context.Context, rt *Runtime, call *ToolCall, next ToolHandler) (*ToolResult, error) {
	if call.Call.Name != ViewImageTool {
		return next(ctx, call)
	}
	var args viewImageArgs
	if err := json.Unmarshal([]byte(call.Call.Arguments), &args); err != nil || strings.TrimSpace(args.Path) == "" {
		return errorResult(`Error: view_image takes {"path": "/path/to/image.png"}.`), nil
	}
	wd := rt.Files
	if call.Env != nil && call.Env.Files != nil {
		wd = call.Env.Files
	}
	if wd == nil {
		return errorResult("Error: " + tools.ErrNoWorkdir.Error()), nil
	}
	img, err := v.load(ctx, wd, args.Path)
	if err != nil {
		return errorResult("Error: " + err.Error()), nil
	}

	vr := v.run(rt)
	vr.mu.Lock()
	vr.known = addViewed(vr.known, img)
	known := slices.Clone(vr.known)
	// A redelivered run runs its pending tools before any model call:
	// then the model is not known yet.
	decided := rt.NoImages || v.Vision != nil || vr.modelName != ""
	vision := v.vision(rt, vr.modelName)
	vr.mu.Unlock()
	text := fmt.Sprintf("Viewed %s (%s, %d bytes).", img.Path, img.MIME, img.Size)
	switch {
	case !decided:
		text += " The image comes with your next request if the model can see images."
	case vision:
		text += " The image comes with your next request."
	default:
		text += " The current model cannot see images, so its content is not available to you."
	}
	return &ToolResult{
		Message: model.Message{Content: text, Status: model.ToolStatusSuccess, Meta: map[string]any{MetaViewedImage: img}},
		Update:  viewedUpdate(call.State, known),
	}, nil
}

// load reads and checks an image of the workdir.
func (v *ViewImage) load(ctx context.Context, wd files.Workdir, p string) (ViewedImage, error) {
	clean, err := files.Clean(p)
	if err != nil {
		return ViewedImage{}, err
	}
	info, err := wd.Stat(ctx, clean)
	if err != nil {
		return ViewedImage{}, err
	}
	if info.IsDir {
		return ViewedImage{}, fmt.Errorf("%s: %w", clean, files.ErrIsDir)
	}
	if info.Size > v.MaxBytes {
		return ViewedImage{}, fmt.Errorf("%s is %d bytes, over the %d bytes an image may have", clean, info.Size, v.MaxBytes)
	}
	data, err := wd.Read(ctx, clean)
	if err != nil {
		return ViewedImage{}, err
	}
	if int64(len(data)) > v.MaxBytes {
		return ViewedImage{}, fmt.Errorf("%s is %d bytes, over the %d bytes an image may have", clean, len(data), v.MaxBytes)
	}
	mime := files.SniffImage(data)
	if mime == "" {
		return ViewedImage{}, fmt.Errorf("%s is not a PNG, JPEG, GIF or WebP image (judged by its content, not its name)", clean)
	}
	sum := sha256.Sum256(data)
	return ViewedImage{Path: clean, MIME: mime, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:])}, nil
}

// addViewed puts img last in list, replacing an older view of its path.
func addViewed(list []ViewedImage, imgs ...ViewedImage) []ViewedImage {
	for _, img := range imgs {
		list = slices.DeleteFunc(list, func(o ViewedImage) bool { return o.Path == img.Path })
		list = append(list, img)
	}
	if len(list) > maxViewedImages {
		list = slices.Clone(list[len(list)-maxViewedImages:])
	}
	return list
}

func viewedOf(st *state.State) []ViewedImage {
	var list []ViewedImage
	if st != nil {
		_, _ = st.Value(ViewedImagesValue, &list)
	}
	return list
}

// viewedUpdate is the update adding imgs to the state's list, or an empty
// one when it already holds them.
func viewedUpdate(st *state.State, imgs []ViewedImage) state.Update {
	old := viewedOf(st)
	list := addViewed(slices.Clone(old), imgs...)
	if slices.Equal(list, old) {
		return state.Update{}
	}
	u, _ := state.SetValue(ViewedImagesValue, list)
	return u
}

// BeforeModel completes viewed_images from the last tool batch: parallel
// views each wrote the list they knew.
func (v *ViewImage) BeforeModel(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	return v.reconcile(st), nil
}

// AfterAgent does the same when the run ends right after a tool batch.
func (v *ViewImage) AfterAgent(ctx context.Context, rt *Runtime, st *state.State) (Result, error) {
	return v.reconcile(st), nil
}

func (v *ViewImage) reconcile(st *state.State) Result {
	imgs := batchImages(st.Messages)
	if len(imgs) == 0 {
		return Result{}
	}
	// Keep the order of the stored list for images it has, so a
	// reconcile after a complete batch changes nothing.
	old := viewedOf(st)
	var missing []ViewedImage
	for _, img := range imgs {
		if !slices.Contains(old, img) {
			missing = append(missing, img)
		}
	}
	if len(missing) == 0 {
		return Result{}
	}
	return Result{Update: viewedUpdate(st, missing)}
}

// ProvidedTools implements ToolProvider.
func (*ViewImage) ProvidedTools() []string { return []string{ViewImageTool} }

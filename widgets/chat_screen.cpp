#include "widgets/chat_screen.h"

#include <QApplication>
#include <QBuffer>
#include <QClipboard>
#include <QComboBox>
#include <QDateTime>
#include <QDoubleSpinBox>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QMessageBox>
#include <QMimeData>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QScrollBar>
#include <QSignalBlocker>
#include <QSpinBox>
#include <QSplitter>
#include <QTextBrowser>
#include <QTimer>
#include <QUrl>
#include <QVBoxLayout>

#include <cstring>

#include "models/chat_model.h"

ChatScreen::ChatScreen(QWidget* parent) : QWidget(parent) {
  m_list = new QListWidget(this);
  m_list->setObjectName("conversationList");
  m_list->setMinimumWidth(160);
  auto* newButton = new QPushButton(tr("New conversation"), this);
  newButton->setObjectName("newConversationButton");
  m_rename = new QPushButton(tr("Rename"), this);
  m_rename->setObjectName("renameConversationButton");
  m_rename->setToolTip(tr("Name the conversation in the list (F2)"));
  m_delete = new QPushButton(tr("Delete"), this);
  m_delete->setObjectName("deleteConversationButton");
  m_delete->setToolTip(tr("Forget the conversation's transcript (the server's caches keep what they hold)"));
  auto* listButtons = new QHBoxLayout;
  listButtons->addWidget(m_rename);
  listButtons->addWidget(m_delete);
  auto* left = new QWidget(this);
  auto* leftLayout = new QVBoxLayout(left);
  leftLayout->setContentsMargins(0, 0, 0, 0);
  leftLayout->addWidget(m_list, 1);
  leftLayout->addLayout(listButtons);
  leftLayout->addWidget(newButton);

  m_transcript = new QTextBrowser(this);
  m_transcript->setObjectName("chatTranscript");
  m_transcript->setOpenLinks(false);
  auto* input = new ChatInput(this);
  connect(input, &ChatInput::imageDropped, this, [this](const QByteArray& bytes) { attachImage(bytes); });
  m_input = input;
  m_input->setObjectName("chatInput");
  m_input->setPlaceholderText(tr("Message (Ctrl+Return sends, Esc stops)"));
  m_input->setMaximumHeight(m_input->fontMetrics().lineSpacing() * 5 + 12);
  m_maxTokens = new QSpinBox(this);
  m_maxTokens->setRange(1, 1 << 20);
  m_maxTokens->setValue(256);
  m_maxTokens->setPrefix(tr("max tokens "));
  m_maxTokens->setObjectName("maxTokens");
  m_maxTokens->setToolTip(tr("The most tokens an answer of this conversation may have"));
  m_temperature = new QDoubleSpinBox(this);
  m_temperature->setObjectName("temperature");
  m_temperature->setRange(0.0, 2.0);
  m_temperature->setSingleStep(0.1);
  m_temperature->setDecimals(2);
  m_temperature->setPrefix(tr("temperature "));
  m_temperature->setToolTip(tr("0 answers greedily (the same answer every time); higher samples more freely"));
  m_systemPrompt = new QLineEdit(this);
  m_systemPrompt->setObjectName("systemPrompt");
  m_systemPrompt->setPlaceholderText(tr("System prompt of this conversation (none)"));
  m_systemPrompt->setClearButtonEnabled(true);
  m_send = new QPushButton(tr("Send"), this);
  m_send->setObjectName("sendButton");
  m_send->setToolTip(tr("Ctrl+Return"));
  m_stop = new QPushButton(tr("Stop"), this);
  m_stop->setObjectName("stopButton");
  m_stop->setToolTip(tr("Esc"));
  m_model = new QComboBox(this);
  m_model->setObjectName("chatModel");
  m_model->setToolTip(tr("The model this turn goes to: the embedded one, or a backend's (--backend)"));
  m_model->setSizeAdjustPolicy(QComboBox::AdjustToContents);
  m_attach = new QPushButton(tr("Image…"), this);
  m_attach->setObjectName("attachImageButton");
  m_attach->setToolTip(tr("Attach an image to the next message (or drop or paste one on the message)"));
  m_imagesLabel = new QLabel(this);
  m_imagesLabel->setObjectName("attachedImages");
  m_clearImages = new QPushButton(tr("Remove images"), this);
  m_clearImages->setObjectName("clearImagesButton");
  m_imagesLabel->hide();
  m_clearImages->hide();
  auto* buttons = new QHBoxLayout;
  buttons->addWidget(m_attach);
  buttons->addWidget(m_imagesLabel);
  buttons->addWidget(m_clearImages);
  buttons->addWidget(m_model);
  buttons->addWidget(m_temperature);
  buttons->addWidget(m_maxTokens);
  buttons->addStretch();
  buttons->addWidget(m_stop);
  buttons->addWidget(m_send);
  auto* right = new QWidget(this);
  auto* rightLayout = new QVBoxLayout(right);
  rightLayout->setContentsMargins(0, 0, 0, 0);
  m_generatedNotice = new QLabel(tr("The embedded model is the generated tiny model: its weights are random, so its answers are noise. "
                                    "File > Open model folder loads a real Qwen3.5 checkpoint; the caches and figures work the same."),
                                 this);
  m_generatedNotice->setObjectName("generatedModelNotice");
  m_generatedNotice->setWordWrap(true);
  m_generatedNotice->setStyleSheet("QLabel { background: #fff4ce; color: #5c4400; padding: 6px; border: 1px solid #e0c060; }");
  m_generatedNotice->hide();
  rightLayout->addWidget(m_generatedNotice);
  rightLayout->addWidget(m_systemPrompt);
  rightLayout->addWidget(m_transcript, 1);
  rightLayout->addWidget(m_input);
  rightLayout->addLayout(buttons);

  auto* split = new QSplitter(Qt::Horizontal, this);
  split->addWidget(left);
  split->addWidget(right);
  split->setStretchFactor(1, 1);
  split->setSizes({200, 800});
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(split);

  m_renderTimer = new QTimer(this);
  m_renderTimer->setSingleShot(true);
  m_renderTimer->setInterval(40);
  connect(m_renderTimer, &QTimer::timeout, this, &ChatScreen::render);
  connect(newButton, &QPushButton::clicked, this, &ChatScreen::newConversation);
  connect(m_rename, &QPushButton::clicked, this, &ChatScreen::renameConversation);
  connect(m_delete, &QPushButton::clicked, this, &ChatScreen::deleteConversation);
  connect(m_systemPrompt, &QLineEdit::textChanged, this, &ChatScreen::storeOptions);
  connect(m_temperature, &QDoubleSpinBox::valueChanged, this, &ChatScreen::storeOptions);
  connect(m_maxTokens, &QSpinBox::valueChanged, this, &ChatScreen::storeOptions);
  m_list->setEditTriggers(QAbstractItemView::EditKeyPressed | QAbstractItemView::DoubleClicked);
  connect(m_list, &QListWidget::itemChanged, this, [this](QListWidgetItem* item) {
    ChatModel* model = m_models.value(item->data(Qt::UserRole).toString());
    if (model == nullptr || item->text() == model->title()) return;
    model->setTitle(item->text());
    const QSignalBlocker block(m_list);
    item->setText(model->title());
  });
  connect(m_send, &QPushButton::clicked, this, &ChatScreen::send);
  connect(m_attach, &QPushButton::clicked, this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, tr("Attach an image"), {}, tr("Images (*.png *.jpg *.jpeg *.webp)"));
    if (path.isEmpty()) return;
    QFile file(path);
    if (!file.open(QIODevice::ReadOnly) || !attachImage(file.readAll()))
      QMessageBox::warning(this, tr("Attach an image"), tr("%1 is not an image this console can read, or is over 20 MiB.").arg(path));
  });
  connect(m_clearImages, &QPushButton::clicked, this, [this] {
    m_images.clear();
    updateButtons();
  });
  connect(m_stop, &QPushButton::clicked, this, &ChatScreen::stop);
  connect(m_transcript, &QTextBrowser::anchorClicked, this, &ChatScreen::onAnchor);
  connect(m_list, &QListWidget::currentItemChanged, this, [this](QListWidgetItem* item) {
    if (item) selectConversation(item->data(Qt::UserRole).toString());
  });
  newConversation();
}

ChatModel* ChatScreen::currentModel() const { return m_models.value(m_current); }

void ChatScreen::newConversation() {
  const QString id = QString("console-%1-%2").arg(QDateTime::currentMSecsSinceEpoch()).arg(++m_counter);
  auto* model = new ChatModel(id, this);
  if (ChatModel* previous = currentModel()) model->options() = previous->options();  // a new chat starts with the last one's options
  m_models[id] = model;
  connect(model, &QAbstractItemModel::dataChanged, this, &ChatScreen::scheduleRender);
  connect(model, &QAbstractItemModel::rowsInserted, this, &ChatScreen::scheduleRender);
  addListItem(model);
  m_input->setFocus();
}

void ChatScreen::addListItem(ChatModel* model) {
  auto* item = new QListWidgetItem(model->title());
  item->setData(Qt::UserRole, model->conversation());
  item->setFlags(item->flags() | Qt::ItemIsEditable);
  m_list->insertItem(0, item);
  m_list->setCurrentItem(item);
}

void ChatScreen::renameConversation() {
  if (QListWidgetItem* item = m_list->currentItem()) m_list->editItem(item);
}

void ChatScreen::deleteConversation() {
  ChatModel* model = currentModel();
  QListWidgetItem* item = m_list->currentItem();
  if (model == nullptr || item == nullptr) return;
  if (model->rowCount() > 0 && !m_confirm(this, tr("Delete the conversation"), tr("Forget \"%1\" and its %n message(s)?", nullptr, model->rowCount()).arg(model->title())))
    return;
  if (model->streaming()) emit stopRequested(model->conversation());
  m_models.remove(model->conversation());
  m_current.clear();
  delete item;  // the list selects the next one
  model->deleteLater();
  if (m_models.isEmpty()) newConversation();
}

void ChatScreen::copyAnswer(int row) {
  ChatModel* model = currentModel();
  if (model == nullptr || row < 0 || row >= model->rowCount()) return;
  QApplication::clipboard()->setText(model->message(row).content);
}

void ChatScreen::regenerate() {
  ChatModel* model = currentModel();
  if (model == nullptr || !m_ready) return;
  const QJsonArray messages = model->regenerate();
  if (messages.isEmpty()) return;
  updateButtons();
  emit sendRequested(model->conversation(), messages, model->sampling(), m_model->currentText());
}

void ChatScreen::selectConversation(const QString& id) {
  m_current = id;
  loadOptions();
  render();
  updateButtons();
}

void ChatScreen::loadOptions() {
  const ChatModel* model = currentModel();
  if (model == nullptr) return;
  const QSignalBlocker a(m_systemPrompt), b(m_temperature), c(m_maxTokens);
  m_systemPrompt->setText(model->options().systemPrompt);
  m_temperature->setValue(model->options().temperature);
  m_maxTokens->setValue(model->options().maxTokens);
}

void ChatScreen::storeOptions() {
  ChatModel* model = currentModel();
  if (model == nullptr) return;
  model->options().systemPrompt = m_systemPrompt->text();
  model->options().temperature = m_temperature->value();
  model->options().maxTokens = m_maxTokens->value();
}

bool ChatScreen::attachImage(const QByteArray& bytes) {
  if (bytes.size() > (20 << 20)) return false;  // the server takes 32 MiB a body: every turn resends the images
  const auto starts = [&bytes](const char* magic, int n) { return bytes.size() >= n && std::memcmp(bytes.constData(), magic, n) == 0; };
  QString mime = starts("\x89PNG\r\n\x1a\n", 8) ? "image/png" : starts("\xFF\xD8\xFF", 3) ? "image/jpeg" : "";
  if (mime.isEmpty() && starts("RIFF", 4) && bytes.mid(8, 4) == "WEBP") mime = "image/webp";
  QByteArray data = bytes;
  if (mime.isEmpty()) {  // another format Qt reads (BMP, GIF, ...): sent as PNG
    QImage image;
    if (!image.loadFromData(bytes)) return false;
    QBuffer png(&data);
    data.clear();
    png.open(QIODevice::WriteOnly);
    image.save(&png, "PNG");
    mime = "image/png";
  }
  m_images.append("data:" + mime + ";base64," + QString::fromLatin1(data.toBase64()));
  updateButtons();
  return true;
}

void ChatScreen::send() {
  ChatModel* model = currentModel();
  const QString text = m_input->toPlainText().trimmed();
  if (!model || (text.isEmpty() && m_images.isEmpty()) || model->streaming() || !m_ready) return;
  const QJsonArray messages = model->beginTurn(text, m_images);
  m_images.clear();
  m_input->clear();
  if (QListWidgetItem* item = m_list->currentItem()) {
    const QSignalBlocker block(m_list);
    item->setText(model->title());
  }
  updateButtons();
  emit sendRequested(model->conversation(), messages, model->sampling(), m_model->currentText());
}

void ChatScreen::stop() {
  if (ChatModel* model = currentModel(); model && model->streaming()) emit stopRequested(model->conversation());
}

void ChatScreen::onDelta(const ChatDelta& delta) {
  if (ChatModel* model = m_models.value(delta.conversation)) model->applyDelta(delta);
}

void ChatScreen::onFinished(const ChatTurnStats& stats) {
  if (ChatModel* model = m_models.value(stats.conversation)) model->finishTurn(stats);
  updateButtons();
}

void ChatScreen::setEngineReady(bool ready) {
  m_ready = ready;
  updateButtons();
}

void ChatScreen::setGeneratedModelNotice(bool generated) { m_generatedNotice->setVisible(generated); }

namespace {

bool IsImageFile(const QUrl& url) {
  static const QStringList kSuffixes = {"png", "jpg", "jpeg", "webp", "bmp", "gif"};
  return url.isLocalFile() && kSuffixes.contains(QFileInfo(url.toLocalFile()).suffix().toLower());
}

}  // namespace

bool ChatInput::canInsertFromMimeData(const QMimeData* source) const {
  if (source->hasImage()) return true;
  if (source->hasUrls())
    for (const QUrl& url : source->urls())
      if (IsImageFile(url)) return true;
  return QPlainTextEdit::canInsertFromMimeData(source);
}

void ChatInput::insertFromMimeData(const QMimeData* source) {
  if (source->hasImage()) {
    QByteArray png;
    QBuffer buffer(&png);
    buffer.open(QIODevice::WriteOnly);
    if (qvariant_cast<QImage>(source->imageData()).save(&buffer, "PNG")) emit imageDropped(png);
    return;
  }
  bool images = false;
  if (source->hasUrls())
    for (const QUrl& url : source->urls())
      if (QFile file(url.toLocalFile()); IsImageFile(url) && file.open(QIODevice::ReadOnly)) {
        emit imageDropped(file.readAll());
        images = true;
      }
  if (!images) QPlainTextEdit::insertFromMimeData(source);
}

void ChatScreen::updateButtons() {
  ChatModel* model = currentModel();
  const bool streaming = model && model->streaming();
  m_imagesLabel->setText(m_images.size() == 1 ? tr("an image attached") : tr("%1 images attached").arg(m_images.size()));
  m_imagesLabel->setVisible(!m_images.isEmpty());
  m_clearImages->setVisible(!m_images.isEmpty());
  m_send->setEnabled(m_ready && !streaming);
  m_stop->setEnabled(streaming);
  m_rename->setEnabled(model != nullptr);
  m_delete->setEnabled(model != nullptr);
}

void ChatScreen::scheduleRender() {
  if (!m_renderTimer->isActive()) m_renderTimer->start();
}

void ChatScreen::onAnchor(const QUrl& url) {
  if (url.fragment() == "regenerate") return regenerate();
  if (url.fragment().startsWith("copy-")) return copyAnswer(url.fragment().mid(5).toInt());
  const QString key = m_current + "/" + url.fragment();
  if (m_expanded.contains(key)) m_expanded.remove(key);
  else m_expanded.insert(key);
  render();
}

void ChatScreen::setReasoningExpanded(int row, bool expanded) {
  const QString key = m_current + "/" + QString::number(row);
  if (expanded) m_expanded.insert(key);
  else m_expanded.remove(key);
  render();
}

void ChatScreen::render() {
  ChatModel* model = currentModel();
  QScrollBar* bar = m_transcript->verticalScrollBar();
  const bool atBottom = bar->value() >= bar->maximum() - 4;
  const int keep = bar->value();
  QString html = "<html><body>";
  if (!model || model->rowCount() == 0)
    html += "<p style='color:gray'>" + tr("Ask something. The answer streams through the same endpoint clients use.").toHtmlEscaped() + "</p>";
  for (int i = 0; model && i < model->rowCount(); ++i) {
    const ChatModel::Message& m = model->message(i);
    auto para = [](const QString& text) { return text.toHtmlEscaped().replace("\n", "<br>"); };
    if (m.role == "user") {
      const QString count = m.images.size() == 1 ? tr("[an image]") : tr("[%1 images]").arg(m.images.size());
      const QString images = m.images.isEmpty() ? QString() : "<br><span style='color:gray'>" + count + "</span>";
      html += "<p style='margin-top:12px'><b>" + tr("You") + "</b><br>" + para(m.content) + images + "</p>";
      continue;
    }
    html += "<p style='margin-top:8px'><b>" + tr("Assistant") + "</b>";
    if (!m.reasoning.isEmpty()) {
      const bool open = m_expanded.contains(m_current + "/" + QString::number(i));
      html += QString("<br><a href='#%1'>%2 %3</a>")
                  .arg(i)
                  .arg(open ? "&#9662;" : "&#9656;")
                  .arg(tr("Reasoning (%1 characters)").arg(m.reasoning.size()));
      if (open) html += "<br><span style='color:#555555'><i>" + para(m.reasoning) + "</i></span>";
    }
    html += "<br>" + para(m.content);
    if (m.streaming) html += " <span style='color:gray'>&#9646;</span>";
    html += "</p>";
    if (m.hasStats) {
      const QString color = m.stats.ok ? "#2f6f3f" : "#b00020";
      QString actions = QString(" &nbsp; <a href='#copy-%1'>%2</a>").arg(i).arg(tr("Copy"));
      if (i + 1 == model->rowCount()) actions += QString(" &nbsp; <a href='#regenerate'>%1</a>").arg(tr("Regenerate"));
      html += QString("<p style='color:%1; font-size:small'>%2%3</p>").arg(color, ChatModel::statsLine(m).toHtmlEscaped(), actions);
    }
  }
  html += "</body></html>";
  m_transcript->setHtml(html);
  bar->setValue(atBottom ? bar->maximum() : keep);
}

void ChatScreen::setModels(const QStringList& models) {
  const QString chosen = m_model->currentText();
  QStringList have;
  for (int i = 0; i < m_model->count(); ++i) have << m_model->itemText(i);
  if (have == models) return;
  m_model->clear();
  m_model->addItems(models);
  if (const int at = m_model->findText(chosen); at >= 0) m_model->setCurrentIndex(at);
}
